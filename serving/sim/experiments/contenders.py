"""The policies an evaluation compares, each built fresh for a run.

A :class:`Contender` is a name and a factory ``make(scenario, split) -> SimPolicy | None``
(``None``: no control). :func:`baseline_contenders` are the baselines; the control loops
(the admission adapter ``serving.sim.control.admission``, the planner adapters
``serving.sim.control.planner``) are built by :mod:`serving.sim.experiments.ours`.

:class:`Combined` runs one admission policy and one planner as a single
:class:`~serving.sim.cluster.SimPolicy`: every request is shown to the planner (it measures
the offered demand from arrivals; its own decision is ignored) and decided by the
admission policy; each runs ``plan`` on its own schedule (the admission policy refreshes
from its snapshots what it decides from), and the planner's plan is the one applied.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from exporters.fleet import PoolRole
from serving.gateway.admission import Decision, RequestInfo
from serving.sim.cluster import ClusterSnapshot, SimPolicy
from serving.sim.control.baselines import ThresholdShedder
from serving.sim.experiments.scenario import Scenario

__all__ = ["NO_CONTROL", "THRESHOLD_SHEDDER", "Combined", "Contender", "baseline_contenders"]

Factory = Callable[[Scenario, tuple[int, int]], SimPolicy | None]


@dataclass(frozen=True, slots=True)
class Contender:
    """A named policy factory (see the module docstring)."""

    name: str
    make: Factory
    plans: bool = False  # whether it moves instances (stability is measured for those)


class Combined:
    """An admission policy and a planner as one policy (see the module docstring)."""

    def __init__(self, admission: SimPolicy, planner: SimPolicy) -> None:
        self.admission = admission
        self.planner = planner
        self.interval_s = min(float(admission.interval_s), float(planner.interval_s))
        self._next = {"admission": 0.0, "planner": 0.0}

    def admit(self, info: RequestInfo) -> Decision:
        self.planner.admit(info)  # the planner observes every arrival (offered demand)
        return self.admission.admit(info)

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        now = snapshot.now_s
        out: Mapping[str, PoolRole] = {}
        if now >= self._next["admission"]:
            self.admission.plan(snapshot)
            self._next["admission"] = _next_due(now, self.admission.interval_s)
        if now >= self._next["planner"]:
            out = self.planner.plan(snapshot)
            self._next["planner"] = _next_due(now, self.planner.interval_s)
        return out


def _next_due(now: float, interval_s: float) -> float:
    interval = float(interval_s)
    return now + interval if math.isfinite(interval) else math.inf


NO_CONTROL = Contender("no control", lambda scenario, split: None)
THRESHOLD_SHEDDER = Contender("threshold shedder", lambda scenario, split: ThresholdShedder())


def baseline_contenders() -> list[Contender]:
    """No control and the Dynamo-style busy-threshold shedder (the best static split is a
    sweep, run by the experiments themselves)."""
    return [NO_CONTROL, THRESHOLD_SHEDDER]
