"""The control loops as contenders: our planner, our admission control, both together,
and the Dynamo-style SLA planner, built from the simulator's adapters
(``serving.sim.control.admission``, ``serving.sim.control.planner``) with the scenario's
objectives and the cluster's profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from controlplane.policies.admission import AdmissionConfig
from serving.sim.cluster import SimPolicy
from serving.sim.control.admission import SIM_CONFIG, SimAdmission
from serving.sim.control.planner import DynamoPolicy, PlannerPolicy
from serving.sim.experiments.contenders import Combined, Contender
from serving.sim.experiments.scenario import Scenario

__all__ = [
    "ADMISSION_INTERVAL_S",
    "DYNAMO_SHORT_INTERVAL_S",
    "OURS",
    "OURS_1S",
    "OURS_NO_FLOOR",
    "control_contenders",
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

#: Ours without the availability floor (the guard's cost and effect).
OURS_NO_FLOOR = "ours, no availability floor"

Build = Callable[[Scenario, tuple[int, int]], SimPolicy]


def _profile(scenario: Scenario, split: tuple[int, int]) -> str:
    return scenario.spec(split).profile


def _admission(interval_s: float, config: AdmissionConfig = SIM_CONFIG) -> Build:
    def build(scenario: Scenario, split: tuple[int, int]) -> SimPolicy:
        return SimAdmission(
            profile=_profile(scenario, split),
            objectives=scenario.objectives,
            interval_s=interval_s,
            config=config,
        )

    return build


def _dynamo(interval_s: float) -> Build:
    def build(scenario: Scenario, split: tuple[int, int]) -> SimPolicy:
        return DynamoPolicy(
            profile=_profile(scenario, split),
            objectives=scenario.objectives,
            interval_s=interval_s,
        )

    return build


def _ours(gate: Build | None) -> Build:
    def build(scenario: Scenario, split: tuple[int, int]) -> SimPolicy:
        policy = PlannerPolicy(profile=_profile(scenario, split), objectives=scenario.objectives)
        if gate is None:
            return policy
        # Each loop on its own tick (admission 0.1 s, planner 5 s).
        return Combined(gate(scenario, split), policy)

    return build


def control_contenders() -> list[Contender]:
    """The control-loop contenders."""
    admission = _admission(ADMISSION_INTERVAL_S)
    return [
        Contender("dynamo planner 180 s", _dynamo(180.0), plans=True),
        Contender(
            f"dynamo planner {DYNAMO_SHORT_INTERVAL_S:g} s",
            _dynamo(DYNAMO_SHORT_INTERVAL_S),
            plans=True,
        ),
        Contender("ours (planner only)", _ours(None), plans=True),
        Contender("ours (admission only)", admission),
        Contender(OURS, _ours(admission), plans=True),
        Contender(OURS_1S, _ours(_admission(1.0)), plans=True),
        Contender(
            OURS_NO_FLOOR,
            _ours(_admission(ADMISSION_INTERVAL_S, replace(SIM_CONFIG, availability_floor=0.0))),
        ),
    ]
