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
    "ADMISSION_INTERVAL_S",
    "DYNAMO_SHORT_INTERVAL_S",
    "OURS",
    "OURS_1S",
    "control_contenders",
    "slo_thresholds",
]

#: The Dynamo-style planner's short interval (its default is 180 s).
DYNAMO_SHORT_INTERVAL_S = 10.0
#: The name of the combined contender (admission control + planner).
OURS = "ours (admission + planner)"
#: How often the admission adapter re-reads the cluster (its ``interval_s``). The adapter
#: syncs its load tracker from each snapshot and, between snapshots, only adds what it
#: admits — nothing drains it, whereas the live gateway's tracker follows every prefill
#: as it completes. A 1-s sync therefore over-counts the prefill queue by up to a second
#: of work and sheds far too much where the TTFT objective is short (azure_conv: 0.25 s);
#: 0.1 s is close to the live behaviour. The 1-s default is kept as a contender of its own.
ADMISSION_INTERVAL_S = 0.1
#: Ours with the admission adapter's default 1-s sync (the sensitivity to it).
OURS_1S = "ours, admission synced every 1 s"


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


def _admission_factory(
    module: ModuleType, interval_s: float
) -> Callable[[Scenario, tuple[int, int]], Any] | None:
    """H4's adapter (``SimAdmission``), built with the scenario's SLO and profile."""
    make = getattr(module, "SimAdmission", None)
    if make is None:
        return None

    def build(scenario: Scenario, split: tuple[int, int]) -> Any:
        ttft_s, itl_s = slo_thresholds(scenario)
        return make(
            profile=_profile(scenario, split), ttft_s=ttft_s, itl_s=itl_s, interval_s=interval_s
        )

    return build


def control_contenders() -> tuple[list[Contender], list[str]]:
    """The control-loop contenders whose adapters exist, and the missing ones' names."""
    out: list[Contender] = []
    missing: list[str] = []
    planner = _module("serving.sim.control.planner")
    admission = _module("serving.sim.control.admission")
    admission_make = (
        _admission_factory(admission, ADMISSION_INTERVAL_S) if admission is not None else None
    )
    admission_1s = _admission_factory(admission, 1.0) if admission is not None else None
    if planner is None:
        missing += ["dynamo planner 180 s", f"dynamo planner {DYNAMO_SHORT_INTERVAL_S:g} s"]
        missing += ["ours (planner only)", OURS, OURS_1S]
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

    def ours(
        gate: Callable[[Scenario, tuple[int, int]], Any] | None,
    ) -> Callable[[Scenario, tuple[int, int]], SimPolicy]:
        def build(scenario: Scenario, split: tuple[int, int]) -> SimPolicy:
            ttft_s, itl_s = slo_thresholds(scenario)
            policy: SimPolicy = planner.PlannerPolicy(
                profile=_profile(scenario, split), ttft_s=ttft_s, itl_s=itl_s
            )
            if gate is not None:
                # Each loop on its own tick (admission 0.1 s, planner 5 s).
                return Combined(gate(scenario, split), policy)
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
    out.append(Contender("ours (planner only)", ours(None), plans=True))
    if admission_make is not None and admission_1s is not None:
        out.append(Contender("ours (admission only)", admission_make))
        out.append(Contender(OURS, ours(admission_make), plans=True))
        out.append(Contender(OURS_1S, ours(admission_1s), plans=True))
    else:
        missing += ["ours (admission only)", OURS, OURS_1S]
    return out, missing
