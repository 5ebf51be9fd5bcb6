"""The control loops as contenders: our planner, our admission control, both together,
and the Dynamo-style SLA planner — built from helper H4's and H5's SimPolicy adapters
(``serving.sim.control.admission``, ``serving.sim.control.planner``) with the scenario's
SLO and the cluster's profile. A module that is not there leaves its contenders out;
:func:`control_contenders` returns what could be built and the names it could not.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from exporters.slo import Metric
from serving.sim.cluster import SimPolicy
from serving.sim.cluster.spec import ClusterSpec
from serving.sim.control.eval.contenders import Combined, Contender
from serving.sim.control.eval.scenario import Scenario

__all__ = [
    "DYNAMO_SHORT_INTERVAL_S",
    "OURS",
    "control_contenders",
    "slo_thresholds",
]

#: The Dynamo-style planner's short interval (its default is 180 s).
DYNAMO_SHORT_INTERVAL_S = 10.0
#: The name of the combined contender (admission control + planner).
OURS = "ours (admission + planner)"


def slo_thresholds(scenario: Scenario) -> tuple[float, float]:
    """``(ttft_s, itl_s)`` of the scenario's objectives (the planners' targets)."""
    by_metric = {o.metric: o.threshold_s for o in scenario.objectives if o.percentile is None}
    return by_metric.get(Metric.TTFT, 1e9), by_metric.get(Metric.ITL, 1e9)


def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _profile(scenario: Scenario, split: tuple[int, int]) -> str:
    spec: ClusterSpec = scenario.spec(split)
    return spec.profile


def _admission_factory(module: ModuleType) -> Callable[[Scenario, tuple[int, int]], Any] | None:
    """H4's adapter (``SimAdmission``), built with the scenario's SLO and profile."""
    make = getattr(module, "SimAdmission", None)
    if make is None:
        return None

    def build(scenario: Scenario, split: tuple[int, int]) -> Any:
        ttft_s, itl_s = slo_thresholds(scenario)
        return make(profile=_profile(scenario, split), ttft_s=ttft_s, itl_s=itl_s)

    return build


def control_contenders() -> tuple[list[Contender], list[str]]:
    """The control-loop contenders whose adapters exist, and the missing ones' names."""
    out: list[Contender] = []
    missing: list[str] = []
    planner = _module("serving.sim.control.planner")
    admission = _module("serving.sim.control.admission")
    admission_make = _admission_factory(admission) if admission is not None else None
    if planner is None:
        missing += ["dynamo planner 180 s", f"dynamo planner {DYNAMO_SHORT_INTERVAL_S:g} s"]
        missing += ["ours (planner only)", OURS]
        if admission_make is None:
            missing.append("ours (admission only)")
        return out, missing

    def dynamo(interval_s: float) -> Callable[[Scenario, tuple[int, int]], SimPolicy]:
        def build(scenario: Scenario, split: tuple[int, int]) -> SimPolicy:
            ttft_s, itl_s = slo_thresholds(scenario)
            policy: SimPolicy = planner.DynamoPolicy(
                profile=_profile(scenario, split), ttft_s=ttft_s, itl_s=itl_s, interval_s=interval_s
            )
            return policy

        return build

    def ours(with_admission: bool) -> Callable[[Scenario, tuple[int, int]], SimPolicy]:
        def build(scenario: Scenario, split: tuple[int, int]) -> SimPolicy:
            ttft_s, itl_s = slo_thresholds(scenario)
            policy: SimPolicy = planner.PlannerPolicy(
                profile=_profile(scenario, split), ttft_s=ttft_s, itl_s=itl_s
            )
            if with_admission and admission_make is not None:
                # Each loop on its own tick (admission 1 s, planner 5 s by default).
                return Combined(admission_make(scenario, split), policy)
            return policy

        return build

    out.append(Contender("dynamo planner 180 s", dynamo(180.0), plans=True))
    out.append(
        Contender(
            f"dynamo planner {DYNAMO_SHORT_INTERVAL_S:g} s",
            dynamo(DYNAMO_SHORT_INTERVAL_S),
            plans=True,
        )
    )
    out.append(Contender("ours (planner only)", ours(False), plans=True))
    if admission_make is not None:
        make = admission_make
        out.append(Contender("ours (admission only)", make))
        out.append(Contender(OURS, ours(True), plans=True))
    else:
        missing += ["ours (admission only)", OURS]
    return out, missing
