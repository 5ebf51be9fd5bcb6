"""The Dynamo-style SLA planner baseline: its formulas and its interval."""

from __future__ import annotations

import math

import pytest

from controlplane.policies.dynamo import (
    DEFAULT_INTERVAL_S,
    DynamoConfig,
    DynamoObservation,
    DynamoPlanner,
    ServiceModelProfile,
    decode_replicas,
    dynamo_split,
    prefill_replicas,
)
from controlplane.policies.planner import InstanceLoad, ServiceModel
from exporters.fleet import PoolRole

MODEL = ServiceModel(
    prefill_tokens_per_s=32_000.0,
    itl_base_s=0.0085,
    itl_per_seq_s=1.45e-5,
    itl_per_context_token_s=4.9e-8,
)
PROFILE = ServiceModelProfile(MODEL)
CONFIG = DynamoConfig(ttft_s=0.5, itl_s=0.03)


def test_prefill_formula() -> None:
    # 10 req/s × 8000 tokens = 80k tokens/s over 32k tokens/s per GPU → 3 replicas.
    assert prefill_replicas(80_000.0, 1.0, 32_000.0, 1) == 3
    # A correction above 1 is capped at 1; below 1 it scales the load down.
    assert prefill_replicas(80_000.0, 2.5, 32_000.0, 1) == 3
    assert prefill_replicas(80_000.0, 0.5, 32_000.0, 1) == 2
    # Two GPUs per engine halve the engines.
    assert prefill_replicas(80_000.0, 1.0, 32_000.0, 2) == 2


def test_decode_formula_uses_the_best_throughput_at_the_itl_target() -> None:
    context = 1000.0 + 500.0 / 2
    slope = MODEL.itl_per_seq_s + MODEL.itl_per_context_token_s * context
    batch = (0.03 - MODEL.itl_base_s) / slope
    per_gpu = batch / 0.03  # at that batch the step takes exactly the ITL target
    assert PROFILE.decode_tokens_per_s_per_gpu(0.03, context) == pytest.approx(per_gpu)
    assert decode_replicas(40_000.0, per_gpu, 1) == math.ceil(40_000.0 / per_gpu)
    assert PROFILE.decode_tokens_per_s_per_gpu(MODEL.itl_base_s / 2, context) == 0.0


def test_split_of_a_fixed_fleet_follows_the_ratio() -> None:
    obs = DynamoObservation(num_requests=1800, duration_s=180.0, isl=8000.0, osl=50.0)
    decision = dynamo_split(obs, PROFILE, CONFIG, num_instances=8)
    assert decision.need_prefill == 3  # 80k tokens/s / 32k
    assert decision.need_decode == 1  # 500 tokens/s: one engine, min_endpoint
    assert (decision.num_prefill, decision.num_decode) == (6, 2)  # 8 × 3/4
    assert decision.evidence["prefill_correction"] == 1.0


def test_corrections_from_observed_latency() -> None:
    obs = DynamoObservation(
        num_requests=1800,
        duration_s=180.0,
        isl=8000.0,
        osl=500.0,
        ttft_s=PROFILE.expected_ttft_s(8000.0) * 0.5,
        itl_s=PROFILE.expected_itl_s(20.0, 8250.0) * 2.0,
        decode_batch=20.0,
    )
    decision = dynamo_split(obs, PROFILE, CONFIG, num_instances=8)
    assert decision.evidence["prefill_correction"] == pytest.approx(0.5)
    assert decision.evidence["decode_correction"] == pytest.approx(2.0)
    assert decision.evidence["corrected_itl_s"] == pytest.approx(0.015)
    assert decision.need_prefill == 2  # 80k × 0.5 / 32k


def test_interval_gates_the_planner_and_pins_hold() -> None:
    assert DEFAULT_INTERVAL_S == 180.0
    planner = DynamoPlanner(PROFILE, CONFIG)
    instances = [InstanceLoad(id=f"p{k}", role=PoolRole.PREFILL) for k in range(2)] + [
        InstanceLoad(id=f"d{k}", role=PoolRole.DECODE, decode_streams=k) for k in range(6)
    ]
    obs = DynamoObservation(num_requests=1800, duration_s=180.0, isl=8000.0, osl=50.0)
    moves = planner.plan(0.0, instances, obs)
    assert moves == {
        "d0": PoolRole.PREFILL,
        "d1": PoolRole.PREFILL,
        "d2": PoolRole.PREFILL,
        "d3": PoolRole.PREFILL,
    }
    assert planner.plan(100.0, instances, obs) == {}  # within the 180 s interval
    pinned = [
        InstanceLoad(i.id, i.role, pinned=i.id in {"d0", "d1"}, decode_streams=i.decode_streams)
        for i in instances
    ]
    again = planner.plan(180.0, pinned, obs)
    assert set(again) == {"d2", "d3", "d4", "d5"}


def test_short_interval_and_bad_config() -> None:
    assert DynamoConfig(ttft_s=0.5, itl_s=0.03, interval_s=5.0).interval_s == 5.0
    with pytest.raises(ValueError, match="interval_s must be a finite number > 0, got 0"):
        DynamoConfig(ttft_s=0.5, itl_s=0.03, interval_s=0)
    with pytest.raises(ValueError, match="num_instances must be >= 2"):
        dynamo_split(DynamoObservation(1, 1, 1, 1), PROFILE, CONFIG, num_instances=1)
