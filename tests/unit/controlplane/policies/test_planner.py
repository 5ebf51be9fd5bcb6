"""The PD planner (pure): fixed snapshots in, decisions out."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.planner import (
    Demand,
    InstanceLoad,
    PlannerConfig,
    PlannerSnapshot,
    ServiceModel,
    SLOTargets,
    plan,
    predict_splits,
)
from exporters.fleet import PoolRole

# H100 Llama-3.1-8B-like figures (serving/sim profile h100-llama3.1-8b): ~32k prompt
# tokens/s per instance, 8.5 ms decode base step, 14.5 µs per sequence, 49 ns per token.
MODEL = ServiceModel(
    prefill_tokens_per_s=32_000.0,
    itl_base_s=0.0085,
    itl_per_seq_s=1.45e-5,
    itl_per_context_token_s=4.9e-8,
    kv_handoff_s=0.01,
)
SLO = SLOTargets(ttft_s=0.5, itl_s=0.03)
CONFIG = PlannerConfig(min_gain_ratio=0.05, min_dwell_s=60.0, max_moves_per_tick=1)


def fleet(num_prefill: int, num_decode: int, **changes: object) -> list[InstanceLoad]:
    return [
        InstanceLoad(id=f"p{k}", role=PoolRole.PREFILL, **changes)  # type: ignore[arg-type]
        for k in range(num_prefill)
    ] + [
        InstanceLoad(id=f"d{k}", role=PoolRole.DECODE, **changes)  # type: ignore[arg-type]
        for k in range(num_decode)
    ]


def snapshot(
    instances: list[InstanceLoad], demand: Demand, now_s: float = 1000.0
) -> PlannerSnapshot:
    return PlannerSnapshot(now_s=now_s, instances=instances, demand=demand, model=MODEL, slo=SLO)


# Prefill-heavy: 10 req/s of 8k-token prompts (80k tokens/s) needs 3+ prefill instances.
PREFILL_HEAVY = Demand(requests_per_s=10.0, prompt_tokens_per_s=80_000.0, output_tokens_per_s=500.0)
# Decode-heavy: 40 req/s of 100-token prompts, 1000 output tokens each (40k tokens/s).
DECODE_HEAVY = Demand(
    requests_per_s=40.0, prompt_tokens_per_s=4_000.0, output_tokens_per_s=40_000.0
)


def test_moves_a_decode_instance_to_the_prefill_bottleneck() -> None:
    result = plan(snapshot(fleet(2, 6), PREFILL_HEAVY), CONFIG)
    assert [(m.from_role, m.to_role) for m in result.moves] == [(PoolRole.DECODE, PoolRole.PREFILL)]
    assert result.target.goodput_rps > result.current.goodput_rps
    assert result.best.num_prefill >= 3
    move = result.moves[0]
    assert move.mode == "routing"
    assert move.predicted["after"]["goodput_rps"] == pytest.approx(result.target.goodput_rps)
    assert result.current.prefill_utilisation_ratio == pytest.approx(80_000 / (2 * 32_000))


def test_moves_a_prefill_instance_to_the_decode_bottleneck() -> None:
    result = plan(snapshot(fleet(6, 2), DECODE_HEAVY), CONFIG)
    assert [(m.from_role, m.to_role) for m in result.moves] == [(PoolRole.PREFILL, PoolRole.DECODE)]
    assert result.target.itl_attainment_ratio > result.current.itl_attainment_ratio


def test_chooses_the_least_loaded_instance_and_at_most_k() -> None:
    instances = fleet(2, 6)
    instances = [
        dataclasses.replace(inst, decode_streams=10 - k) if inst.role is PoolRole.DECODE else inst
        for k, inst in enumerate(instances)
    ]
    result = plan(snapshot(instances, PREFILL_HEAVY), CONFIG)
    assert [m.instance_id for m in result.moves] == ["d5"]  # 10 - 7 = 3 streams, the fewest
    two = plan(
        snapshot(instances, PREFILL_HEAVY), dataclasses.replace(CONFIG, max_moves_per_tick=2)
    )
    assert [m.instance_id for m in two.moves] == ["d5", "d4"]


def test_small_gains_do_nothing() -> None:
    # Balanced for the demand: the best split differs from the current one by less than the
    # margin, so nothing moves.
    demand = Demand(requests_per_s=10.0, prompt_tokens_per_s=30_000.0, output_tokens_per_s=2_000.0)
    result = plan(snapshot(fleet(3, 3), demand), CONFIG)
    assert result.moves == ()
    assert result.current.goodput_rps == pytest.approx(10.0, rel=0.02)


def test_margin_blocks_a_real_but_small_gain() -> None:
    instances = fleet(2, 6)
    demand = Demand(requests_per_s=10.0, prompt_tokens_per_s=52_000.0, output_tokens_per_s=500.0)
    free = plan(snapshot(instances, demand), dataclasses.replace(CONFIG, min_gain_ratio=0.0))
    assert free.moves, free.reason
    gain = free.best.goodput_rps - free.current.goodput_rps  # hysteresis is on the best split
    ratio = gain / free.current.goodput_rps
    strict = plan(
        snapshot(instances, demand), dataclasses.replace(CONFIG, min_gain_ratio=ratio * 1.01)
    )
    assert strict.moves == ()
    assert "within the margin" in strict.reason


def test_dwell_time_is_respected() -> None:
    recent = fleet(2, 6, last_role_change_s=990.0)
    assert plan(snapshot(recent, PREFILL_HEAVY, now_s=1000.0), CONFIG).moves == ()
    later = plan(snapshot(recent, PREFILL_HEAVY, now_s=1050.0), CONFIG)
    assert later.moves


def test_pinned_instances_never_move() -> None:
    instances = [
        dataclasses.replace(inst, pinned=inst.role is PoolRole.DECODE) for inst in fleet(2, 6)
    ]
    result = plan(snapshot(instances, PREFILL_HEAVY), CONFIG)
    assert result.moves == ()
    partly = [dataclasses.replace(inst, pinned=inst.id != "d3") for inst in fleet(2, 6)]
    moved = plan(snapshot(partly, PREFILL_HEAVY), dataclasses.replace(CONFIG, max_moves_per_tick=3))
    assert [m.instance_id for m in moved.moves] == ["d3"]


def test_a_moving_instance_counts_once_in_its_target_pool() -> None:
    instances = fleet(2, 6)
    instances[2] = dataclasses.replace(
        instances[2], draining=True, moving_to=PoolRole.PREFILL, last_role_change_s=995.0
    )
    result = plan(snapshot(instances, PREFILL_HEAVY), CONFIG)
    assert result.evidence["pools"] == {"prefill": 3.0, "decode": 5.0}
    assert all(m.instance_id != instances[2].id for m in result.moves)
    # An operator drain (no target) counts in neither pool.
    drained = fleet(2, 6)
    drained[0] = dataclasses.replace(drained[0], draining=True)
    assert plan(snapshot(drained, PREFILL_HEAVY), CONFIG).evidence["pools"] == {
        "prefill": 1.0,
        "decode": 6.0,
    }


def test_keeps_a_minimum_pool() -> None:
    result = plan(snapshot(fleet(1, 1), PREFILL_HEAVY), CONFIG)
    assert result.moves == ()


def test_restart_mode_when_the_connector_cannot_serve_both_roles() -> None:
    result = plan(snapshot(fleet(2, 6, live_switch=False), PREFILL_HEAVY), CONFIG)
    assert [m.mode for m in result.moves] == ["restart"]


def test_no_demand_no_move() -> None:
    result = plan(snapshot(fleet(1, 7), Demand(0.0, 0.0, 0.0)), CONFIG)
    assert result.moves == () and result.reason == "no demand"


def test_deep_overload_balances_headroom() -> None:
    # Far beyond what 4 instances serve: no split meets the SLO; move toward balance.
    demand = Demand(requests_per_s=50.0, prompt_tokens_per_s=400_000.0, output_tokens_per_s=500.0)
    result = plan(snapshot(fleet(1, 3), demand), CONFIG)
    assert result.best.goodput_rps == 0.0
    assert [m.to_role for m in result.moves] == [PoolRole.PREFILL]


def test_prediction_matches_the_md1_formula() -> None:
    demand = Demand(requests_per_s=10.0, prompt_tokens_per_s=20_000.0, output_tokens_per_s=0.0)
    figures = predict_splits(
        np.array([1.0]),
        np.array([1.0]),
        demand=demand,
        model=dataclasses.replace(MODEL, kv_handoff_s=0.0),
        slo=SLOTargets(ttft_s=0.2, itl_s=1.0),
        prefill_rate=32_000.0,
    )
    rho, service = 20_000 / 32_000, 2_000 / 32_000
    expected = 1 - rho * math.exp(-2 * (1 - rho) * (0.2 - service) / service)
    assert figures["ttft_attainment_ratio"][0] == pytest.approx(expected)


@settings(max_examples=60, deadline=None)
@given(
    rps=st.floats(1.0, 60.0),
    prompt=st.floats(50.0, 8000.0),
    output=st.floats(10.0, 1500.0),
    num_prefill=st.integers(1, 15),
    total=st.integers(4, 16),
)
def test_no_oscillation_under_stationary_demand(
    rps: float, prompt: float, output: float, num_prefill: int, total: int
) -> None:
    """Applying each plan at once, every tick, under the same demand: the planner moves in
    one direction only, and stops."""
    num_prefill = min(num_prefill, total - 1)
    demand = Demand(rps, rps * prompt, rps * output)
    instances = fleet(num_prefill, total - num_prefill)
    directions: set[PoolRole] = set()
    now = 1000.0
    quiet = 0
    for _ in range(3 * total):
        result = plan(snapshot(instances, demand, now_s=now), CONFIG)
        moved = {m.instance_id: m.to_role for m in result.moves}
        directions.update(moved.values())
        quiet = 0 if moved else quiet + 1
        instances = [
            dataclasses.replace(i, role=moved[i.id], last_role_change_s=now) if i.id in moved else i
            for i in instances
        ]
        now += 61.0
    assert len(directions) <= 1, "the planner moved instances both ways"
    assert quiet >= total, "the planner did not settle"


def test_bad_config_names_the_field() -> None:
    with pytest.raises(ValueError, match="max_moves_per_tick must be an integer >= 1, got 0"):
        PlannerConfig(max_moves_per_tick=0)
    with pytest.raises(ValueError, match="ttft_s must be a finite number > 0"):
        SLOTargets(ttft_s=0.0, itl_s=0.1)


@settings(max_examples=60, deadline=None)
@given(
    rps=st.floats(0.2, 12.0),
    prompt=st.floats(3_000.0, 16_000.0),
    output=st.floats(10.0, 600.0),
    burst=st.floats(1.0, 30.0),
    spread=st.floats(0.0, 2.0),
    num_prefill=st.integers(1, 7),
    total=st.integers(2, 8),
)
def test_reaches_the_best_predicted_split_from_any_start_with_long_bursty_prompts(
    rps: float,
    prompt: float,
    output: float,
    burst: float,
    spread: float,
    num_prefill: int,
    total: int,
) -> None:
    """Long prompts (a share over the TTFT objective on an idle instance: 16 k tokens take
    0.5 s at 32 k tokens/s), bursty arrivals: applying each plan, the planner ends on a split
    whose predicted goodput is within its hysteresis of the best of *every* split (a search
    by predicted goodput, no local optimum), whatever the start."""
    num_prefill = min(num_prefill, total - 1)
    demand = Demand(rps, rps * prompt, rps * output, arrival_scv=burst, service_scv=spread)
    counts = np.arange(1, total, dtype=np.float64)
    everywhere = predict_splits(
        counts,
        total - counts,
        demand=demand,
        model=MODEL,
        slo=SLO,
        prefill_rate=MODEL.prefill_tokens_per_s,
        context_per_stream=prompt + 0.5 * output,
    )["goodput_rps"]
    instances = fleet(num_prefill, total - num_prefill)
    now = 1000.0
    for _ in range(total + 1):
        result = plan(snapshot(instances, demand, now_s=now), CONFIG)
        moved = {m.instance_id: m.to_role for m in result.moves}
        instances = [
            dataclasses.replace(i, role=moved[i.id], last_role_change_s=now) if i.id in moved else i
            for i in instances
        ]
        now += 61.0
    assert not result.moves, "the planner did not settle"
    final = sum(i.role is PoolRole.PREFILL for i in instances)
    best = float(everywhere.max())
    assert result.current.goodput_rps == pytest.approx(float(everywhere[final - 1]))
    if best > 0:
        assert result.current.goodput_rps * (1 + CONFIG.min_gain_ratio) >= best - 1e-9
