"""One rule for an SLO's latency targets (controlplane.policies.targets)."""

from __future__ import annotations

from controlplane.policies.planner import SLOTargets
from controlplane.policies.targets import (
    UNCONSTRAINED_S,
    itl_target_s,
    slo_targets,
    ttft_target_s,
)
from exporters.slo import Metric, Objective

TTFT = Objective(Metric.TTFT, 0.5)


def test_the_itl_target_is_the_tightest_itl_or_tpot_objective() -> None:
    assert itl_target_s((TTFT, Objective(Metric.ITL, 0.2), Objective(Metric.TPOT, 0.05))) == 0.05
    assert itl_target_s((Objective(Metric.ITL, 0.04), Objective(Metric.TPOT, 0.05))) == 0.04
    assert itl_target_s((Objective(Metric.ITL, 0.1, "p99"),)) == 0.1  # percentiles count
    assert itl_target_s((TTFT, Objective(Metric.E2EL, 9.0))) is None


def test_the_ttft_target() -> None:
    assert ttft_target_s((TTFT, Objective(Metric.ITL, 0.05))) == 0.5
    assert ttft_target_s((Objective(Metric.ITL, 0.05),)) is None


def test_registry_targets_take_the_tightest_of_every_slo() -> None:
    chat = (Objective(Metric.TTFT, 0.3), Objective(Metric.ITL, 0.08))
    bulk = (Objective(Metric.TTFT, 5.0), Objective(Metric.TPOT, 0.05))
    assert slo_targets([chat, bulk]) == SLOTargets(ttft_s=0.3, itl_s=0.05)
    assert slo_targets([(TTFT,)]) == SLOTargets(ttft_s=0.5, itl_s=UNCONSTRAINED_S)
    assert slo_targets([(Objective(Metric.E2EL, 9.0),)]) is None
    assert slo_targets([]) is None
