"""The experiments end to end on a small cluster and short runs: determinism, the knee,
the overload table, the shift, stability, and the combined policy."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from exporters.fleet import PoolRole
from serving.gateway.admission import ADMIT, Decision, RequestInfo
from serving.sim.cluster import ClusterSnapshot
from serving.sim.experiments.contenders import Combined, Contender, baseline_contenders
from serving.sim.experiments.experiments import (
    Capacity,
    capacity,
    overload,
    stability,
    workload_shift,
)
from serving.sim.experiments.scenario import Scenario

SCENARIO = Scenario("azure_conv", 3, 12.0)


@pytest.fixture(scope="module")
def cap() -> Capacity:
    return capacity(SCENARIO, start=4.0, rel_tol=0.1)


def table(scenario: Scenario) -> list[dict[str, object]]:
    cap = capacity(scenario, start=4.0, rel_tol=0.2)
    _, cells = overload(scenario, cap, baseline_contenders(), levels=(2.0,))
    return [{"level": c.level, "knee": cap.rate, **c.outcome.row()} for c in cells]


def test_same_seed_same_table_other_seed_other_table() -> None:
    small = Scenario("azure_conv", 3, 5.0)
    first = table(small)
    assert first == table(small)
    assert table(Scenario("azure_conv", 3, 5.0, seed=2)) != first


def test_capacity_knee_meets_target_and_overload_rows_are_complete(cap: Capacity) -> None:
    assert cap.knee.bracketed
    assert cap.knees[cap.split] == cap.rate == max(cap.knees.values())
    assert cap.peak_goodput_rps > 0
    peak, cells = overload(SCENARIO, cap, baseline_contenders(), levels=(1.5, 2.0))
    assert peak >= cap.peak_goodput_rps
    names = {(c.level, c.contender) for c in cells}
    assert names == {
        (lvl, n) for lvl in (1.5, 2.0) for n in ("no control", "threshold shedder", "best static")
    }
    for c in cells:
        assert c.peak_goodput_rps == peak
        assert c.outcome.rate_scale == c.level * cap.rate
        assert 0.0 <= c.goodput_ratio <= 1.0


class Flip:
    """Moves one instance every tick (a deliberately unstable planner)."""

    interval_s = 2.0

    def admit(self, info: RequestInfo) -> Decision:
        del info
        return ADMIT

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        prefill = [v for v in snapshot.instances if v.role is PoolRole.PREFILL]
        decode = [v for v in snapshot.instances if v.role is PoolRole.DECODE]
        if len(prefill) > 1:
            return {prefill[0].id: PoolRole.DECODE}
        return {decode[0].id: PoolRole.PREFILL}


def test_stability_counts_role_changes_per_hour_and_drops_nothing(cap: Capacity) -> None:
    out = stability(SCENARIO, cap, Contender("flip", lambda s, split: Flip(), plans=True))
    changes = len(out.outcome.role_changes)
    end_s = out.outcome.end_s
    assert changes >= int(end_s / Flip.interval_s) - 1  # one per 2-s tick
    assert out.role_changes_per_h == changes * 3600.0 / max(end_s, 12.0)
    assert out.outcome.moved_jobs > 0
    assert out.outcome.dropped_jobs == 0


def test_shift_compares_each_phase_with_its_best_static_split() -> None:
    from exporters.slo import Metric, Objective

    scenario = Scenario(
        "azure_conv", 3, 20.0, objectives=(Objective(Metric.TTFT, 1.0), Objective(Metric.ITL, 0.05))
    )
    setup, outs = workload_shift(scenario, baseline_contenders(), factor=4.0)
    assert setup.shift_s == 10.0 and setup.rate > 0
    assert setup.long.rate < setup.short.rate  # longer prompts: a lower knee
    names = [o.contender for o in outs]
    assert names[:2] == ["no control", "threshold shedder"] and names[2].startswith("static ")
    for o in outs:
        for ratio in o.phase_ratios:
            assert 0.0 <= ratio <= 1.0 + 1e-9  # the per-phase best static split is the max
        assert o.recovery_s >= 0.0


class Counting:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.ticks: list[float] = []
        self.admitted = 0

    def admit(self, info: RequestInfo) -> Decision:
        del info
        self.admitted += 1
        return ADMIT

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        self.ticks.append(snapshot.now_s)
        return {"x": PoolRole.DECODE} if self.interval_s > 1 else {}


def test_combined_runs_each_part_on_its_own_schedule_and_applies_the_planner_s_plan() -> None:
    gate, planner = Counting(0.5), Counting(2.0)
    both = Combined(gate, planner)
    assert both.interval_s == 0.5
    plans = [both.plan(ClusterSnapshot(0.5 * k, ())) for k in range(9)]  # 0 .. 4 s
    assert gate.ticks == [0.5 * k for k in range(9)]
    assert planner.ticks == [0.0, 2.0, 4.0]
    assert [bool(p) for p in plans] == [k in (0, 4, 8) for k in range(9)]
    both.admit(RequestInfo("r", "m", "", "", "", 1, 1, True, 0.0))
    assert gate.admitted == 1 and planner.admitted == 1  # the planner sees arrivals too
