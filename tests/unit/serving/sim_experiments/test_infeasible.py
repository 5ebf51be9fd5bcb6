"""The long-prompt scenario with no knee (``serving.sim.experiments.infeasible``) and the
admission adapter's ``infeasible`` choice."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from exporters.fleet import PoolRole
from serving.sim.control.admission import SimAdmission
from serving.sim.experiments.contenders import NO_CONTROL
from serving.sim.experiments.infeasible import (
    BEST_STATIC,
    BEST_STATIC_ADMISSION,
    LongPromptCell,
    LongPromptSetup,
    _admission,
    _ours,
    long_prompt_json,
    long_prompt_table,
    long_prompt_vs_best_static,
    long_prompts,
    planner_starts,
)
from serving.sim.experiments.run import RunOutcome
from serving.sim.experiments.scenario import Scenario, slo_for

SCENARIO = Scenario("azure_code", 2, 30.0)
Outcome = tuple[LongPromptSetup, list[LongPromptCell]]


def test_the_adapter_carries_the_slos_choice() -> None:
    profile = SCENARIO.spec((1, 1)).profile
    gate = SimAdmission(profile=profile, objectives=slo_for("azure_code"), infeasible="reject")
    assert gate.policy.slos[gate.slo_label].infeasible == "reject"
    assert SimAdmission(profile=profile, objectives=slo_for("azure_code")).slo.infeasible == (
        "admit"
    )


@pytest.fixture(scope="module")
def outcome() -> Outcome:
    return long_prompts(
        SCENARIO, [NO_CONTROL, _admission("admit"), _admission("reject")], rates=(1.0, 4.0)
    )


def test_no_knee_is_said_and_contenders_are_compared_at_fixed_rates(outcome: Outcome) -> None:
    setup, cells = outcome
    assert setup.knee is None
    assert all(attainment < SCENARIO.target for _, _, attainment in setup.probes)
    assert {c.rate for c in cells} == {1.0, 4.0}
    assert all(0.1 < c.infeasible_share < 0.5 for c in cells)  # a share cannot meet the TTFT
    table = long_prompt_table(SCENARIO, setup, cells)
    assert "no knee: no static split meets attainment 0.95" in table
    assert "ours (admission only), infeasible reject" in table and "best static" in table
    headline = long_prompt_json(setup, cells)
    assert headline["knee_rate_scale"] is None and headline["rates"] == [1.0, 4.0]


def test_infeasible_requests_are_told_apart_and_rejecting_them_pays(outcome: Outcome) -> None:
    _, cells = outcome
    by = {(c.contender, c.rate): c for c in cells}
    reject = by[("ours (admission only), infeasible reject", 4.0)]
    admit = by[("ours (admission only), infeasible admit", 4.0)]
    assert reject.num_infeasible is not None and admit.num_infeasible is not None
    assert reject.num_infeasible["reject"] > 0 and reject.num_infeasible["admit"] == 0
    assert admit.num_infeasible["reject"] == 0
    assert admit.num_infeasible["admit"] + admit.num_infeasible["defer"] > 0
    none = by[("no control", 4.0)]
    assert reject.outcome.goodput_rps > none.outcome.goodput_rps
    assert by[("no control", 1.0)].num_infeasible is None


def test_the_planner_also_starts_from_the_balanced_and_the_decode_heavy_split() -> None:
    assert planner_starts(4, (3, 1)) == [(2, 2), (1, 3)]
    assert planner_starts(8, (4, 4)) == [(1, 7)]
    assert planner_starts(2, (1, 1)) == []


def _cell(rate: float, name: str, goodput_rps: float) -> LongPromptCell:
    outcome = cast(RunOutcome, SimpleNamespace(goodput_rps=goodput_rps))
    return LongPromptCell(rate, name, outcome, 0.2, None)


def test_ratios_are_taken_against_the_best_static_split_with_the_same_admission() -> None:
    ours = "ours (admission + planner), infeasible reject"
    cells = [
        _cell(1.0, BEST_STATIC, 0.5),
        _cell(1.0, BEST_STATIC_ADMISSION, 2.0),
        _cell(1.0, ours, 2.0),
        _cell(1.0, f"{ours}, from 2P:2D", 1.8),
        _cell(1.0, "ours (planner only), from 2P:2D", 0.25),
        _cell(1.0, "no control", 0.5),
        _cell(2.0, BEST_STATIC, 0.0),
        _cell(2.0, BEST_STATIC_ADMISSION, 4.0),
        _cell(2.0, ours, 4.4),
        _cell(2.0, f"{ours}, from 2P:2D", 3.0),
        _cell(2.0, "ours (planner only), from 2P:2D", 0.0),
    ]
    ratios = long_prompt_vs_best_static(cells)
    assert ratios == {
        ours: [1.0, 1.1],
        f"{ours}, from 2P:2D": [0.9, 0.75],
        "ours (planner only), from 2P:2D": [0.5, None],  # the best static served none
    }


def test_the_headline_gives_the_worst_ratio(outcome: Outcome) -> None:
    setup, cells = outcome
    headline = long_prompt_json(setup, cells)
    # Two instances: one split, so the planner cannot move and equals no control there.
    assert headline["vs_best_static"] == {"ours (planner only), from 1P:1D": [1.0, 1.0]}
    assert headline["planner_only_vs_best_static"] == 1.0
    assert headline["ours_vs_best_static"] is None  # ours is not among these contenders
    rows = {c.contender for c in cells}
    assert BEST_STATIC_ADMISSION in rows
    assert "÷ best static: 1.00 / 1.00" in long_prompt_table(SCENARIO, setup, cells)


def test_ours_reaches_the_best_static_split_from_every_start() -> None:
    scenario = Scenario("azure_code", 4, 30.0)
    _, cells = long_prompts(scenario, [_ours("reject")], rates=(4.0,))
    by = {c.contender: c for c in cells}
    ours = "ours (admission + planner), infeasible reject"
    for start in ((2, 2), (1, 3)):
        cell = by[f"{ours}, from {start[0]}P:{start[1]}D"]
        moved = [change for change in cell.outcome.role_changes if change.new is PoolRole.PREFILL]
        assert len(moved) == 3 - start[0]  # to 3P:1D, the best static split here
    ratios = long_prompt_vs_best_static(cells)
    assert all(
        r is not None and r >= 0.9
        for name, row in ratios.items()
        if "admission" in name
        for r in row
    )
