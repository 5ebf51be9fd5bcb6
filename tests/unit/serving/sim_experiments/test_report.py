"""The control contenders build from the simulator's adapters and run deterministically;
the tables and plots render from a small evaluation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane.policies.planner import SLOTargets
from serving.sim.cluster import SimPolicy
from serving.sim.control.planner import PlannerPolicy
from serving.sim.experiments.contenders import Combined, baseline_contenders
from serving.sim.experiments.experiments import (
    Capacity,
    OverloadCell,
    ShiftOutcome,
    ShiftSetup,
    StabilityOutcome,
    capacity,
    overload,
    stability,
    workload_shift,
)
from serving.sim.experiments.ours import OURS, control_contenders
from serving.sim.experiments.plots import write_plots
from serving.sim.experiments.report import (
    class_table,
    overload_table,
    shift_table,
    stability_table,
    token_table,
)
from serving.sim.experiments.run import run_policy
from serving.sim.experiments.scenario import Scenario

SCENARIO = Scenario("azure_conv", 3, 8.0)


def test_control_contenders_build_simpolicies_with_the_scenario_slo() -> None:
    contenders = control_contenders()
    names = [c.name for c in contenders]
    assert OURS in names and "dynamo planner 180 s" in names
    for contender in contenders:
        policy = contender.make(SCENARIO, (1, 2))
        assert isinstance(policy, SimPolicy), contender.name
    ours = next(c for c in contenders if c.name == OURS).make(SCENARIO, (1, 2))
    assert isinstance(ours, Combined)
    assert isinstance(ours.planner, PlannerPolicy)
    assert ours.planner.slo == SLOTargets(ttft_s=0.25, itl_s=0.05)  # the scenario's SLO


def test_ours_is_deterministic() -> None:
    ours = next(c for c in control_contenders() if c.name == OURS)
    runs = [
        run_policy(SCENARIO, (1, 2), 12.0, ours.make(SCENARIO, (1, 2)), name=OURS) for _ in range(2)
    ]
    assert runs[0].row() == runs[1].row()
    assert runs[0].rejected_ratio > 0  # 12x the trace rate overloads 3 instances


@dataclass
class Evaluation:
    cap: Capacity
    peak: float
    cells: list[OverloadCell]
    setup: ShiftSetup
    shifts: list[ShiftOutcome]
    stable: list[StabilityOutcome]


@pytest.fixture(scope="module")
def evaluation() -> Evaluation:
    cap = capacity(SCENARIO, start=4.0, rel_tol=0.2)
    peak, cells = overload(SCENARIO, cap, baseline_contenders(), levels=(2.0,))
    setup, shifts = workload_shift(Scenario("azure_conv", 3, 10.0), baseline_contenders())
    planner = next(c for c in control_contenders() if c.plans)
    return Evaluation(cap, peak, cells, setup, shifts, [stability(SCENARIO, cap, planner)])


def test_tables_name_every_contender(evaluation: Evaluation) -> None:
    text = overload_table(
        evaluation.cells, {"azure_conv": evaluation.cap}, {"azure_conv": evaluation.peak}
    )
    for name in ("no control", "threshold shedder", "best static"):
        assert f"| {name} |" in text
    assert "2× knee" in text
    shift = shift_table(evaluation.setup, evaluation.shifts)
    assert "phase 1" in shift and "| no control |" in shift
    assert "dropped" in stability_table(evaluation.stable)


def test_token_goodput_and_prompt_classes_are_counted_by_arrival(evaluation: Evaluation) -> None:
    shedder = next(c for c in evaluation.cells if c.contender == "threshold shedder")
    out = shedder.outcome
    good = out.good & (out.arrival_s < out.duration_s)
    assert out.total.good_tokens == int(out.tokens[good].sum()) > 0
    assert out.token_goodput_tps == pytest.approx(out.total.good_tokens / out.duration_s)
    assert all(c.peak_token_goodput_tps == shedder.peak_token_goodput_tps for c in evaluation.cells)
    assert shedder.peak_token_goodput_tps >= max(
        c.outcome.token_goodput_tps for c in evaluation.cells if c.contender == "best static"
    )
    plain = next(c for c in evaluation.cells if c.contender == "no control").outcome
    assert plain.offered_tokens == int(plain.tokens[plain.arrival_s < plain.duration_s].sum())
    assert out.offered_tokens == plain.offered_tokens  # the same workload
    counts = out.class_counts((500, 1000))
    assert [(k.low, k.high) for k in counts] == [(0, 500), (500, 1000), (1000, None)]
    assert sum(k.offered for k in counts) == out.total.offered
    assert sum(k.rejected for k in counts) == out.total.rejected
    assert sum(k.rejected_share for k in counts) == pytest.approx(
        1.0 if out.total.rejected else 0.0
    )
    tokens = token_table(evaluation.cells)
    assert "good tokens/s" in tokens and "| threshold shedder |" in tokens
    classes = class_table(evaluation.cells, {"azure_conv": (500, 1000)})
    assert "≤ 500 / 500–1,000 / > 1,000" in classes
    assert ("| threshold shedder |" in classes) == (out.total.rejected > 0)
    assert "| no control |" not in classes  # rejects nothing


def test_plots_are_written(evaluation: Evaluation, tmp_path: Path) -> None:
    paths = write_plots(
        tmp_path,
        cells=evaluation.cells,
        caps={"azure_conv": evaluation.cap},
        peaks={"azure_conv": evaluation.peak},
        shifts=evaluation.shifts,
        setup=evaluation.setup,
    )
    assert [p.name for p in paths] == ["control_overload.png", "control_shift.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
