"""The long-prompt scenario with no knee (``serving.sim.experiments.infeasible``) and the
admission adapter's ``infeasible`` choice."""

from __future__ import annotations

import pytest

from serving.sim.control.admission import SimAdmission
from serving.sim.experiments.contenders import NO_CONTROL
from serving.sim.experiments.infeasible import (
    LongPromptCell,
    LongPromptSetup,
    _admission,
    long_prompt_json,
    long_prompt_table,
    long_prompts,
)
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
