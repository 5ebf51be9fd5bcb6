"""The Dynamo-style busy-threshold shedder and the static split sweep."""

from __future__ import annotations

import pytest

from exporters.fleet import PoolRole
from serving.gateway.admission import RequestInfo
from serving.sim.cluster import ClusterSnapshot, InstanceView
from serving.sim.control.baselines import (
    BusyThresholds,
    ThresholdShedder,
    best_static_split,
    busy_decision,
    static_splits,
)
from serving.sim.experiments.run import run_policy
from serving.sim.experiments.scenario import Scenario

P, D, BOTH = PoolRole.PREFILL, PoolRole.DECODE, PoolRole.BOTH
LIMITS = BusyThresholds(prefill_tokens=1000, decode_kv_ratio=0.8)


def view(role: PoolRole, prefill_tokens: int = 0, kv: float = 0.0, k: int = 0) -> InstanceView:
    return InstanceView(f"{role.value}-{k}", role, 0, 0, kv, prefill_tokens, 0)


def info() -> RequestInfo:
    return RequestInfo("r", "m", "", "", "", 100, 10, True, 0.0)


def test_admits_while_one_instance_of_each_pool_is_below_its_threshold() -> None:
    views = [view(P, 5000, k=0), view(P, 999, k=1), view(D, kv=0.95, k=0), view(D, kv=0.5, k=1)]
    assert busy_decision(views, LIMITS).admit


def test_rejects_when_every_prefill_instance_is_busy() -> None:
    views = [view(P, 5000, k=0), view(P, 1001, k=1), view(D, kv=0.1)]
    decision = busy_decision(views, LIMITS)
    assert not decision.admit
    assert "prefill" in decision.reason and "1001" in decision.reason
    assert decision.retry_after_s is not None


def test_rejects_when_every_decode_instance_is_kv_busy() -> None:
    views = [view(P, 0), view(D, kv=0.81, k=0), view(D, kv=0.9, k=1)]
    decision = busy_decision(views, LIMITS)
    assert not decision.admit and "KV use 0.81" in decision.reason


def test_colocated_instances_count_in_both_pools_and_nothing_observed_admits() -> None:
    assert busy_decision([view(BOTH, 2000, 0.1)], LIMITS).admit is False
    assert busy_decision([view(BOTH, 10, 0.1)], LIMITS).admit
    assert busy_decision([], LIMITS).admit


def test_shedder_decides_from_its_last_snapshot() -> None:
    shedder = ThresholdShedder(LIMITS, interval_s=0.25)
    assert shedder.admit(info()).admit  # fail open before the first snapshot
    busy = ClusterSnapshot(1.0, (view(P, 5000), view(D)))
    assert shedder.plan(busy) == {}  # never moves an instance
    assert not shedder.admit(info()).admit and not shedder.admit(info()).admit
    assert shedder.num_rejected == 2
    shedder.plan(ClusterSnapshot(2.0, (view(P, 10), view(D))))
    assert shedder.admit(info()).admit


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"prefill_tokens": 0}, "prefill_tokens"), ({"decode_kv_ratio": -1}, "decode_kv_ratio")],
)
def test_invalid_thresholds_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BusyThresholds(**kwargs)


def test_shedder_sheds_under_overload_and_not_under_light_load() -> None:
    scenario = Scenario("mooncake", 4, 30.0)
    light = run_policy(Scenario("azure_conv", 4, 30.0), (2, 2), 1.0, ThresholdShedder())
    heavy = run_policy(scenario, (3, 1), 4.0, ThresholdShedder())
    none = run_policy(scenario, (3, 1), 4.0, None)
    assert light.total.rejected == 0
    assert heavy.total.rejected > 0 and none.total.rejected == 0
    assert heavy.attainment_ratio > none.attainment_ratio  # the admitted are served better


def test_static_splits() -> None:
    assert static_splits(4) == [(1, 3), (2, 2), (3, 1)]
    assert static_splits(8, stride=3) == [(1, 7), (4, 4), (7, 1)]
    with pytest.raises(ValueError, match="num_instances"):
        static_splits(1)
    with pytest.raises(ValueError, match="stride"):
        static_splits(4, stride=0)


def test_best_static_split_takes_the_highest_score_first_among_equals() -> None:
    scores = {(1, 3): 1.0, (2, 2): 3.0, (3, 1): 3.0}
    result = best_static_split(scores, scores.__getitem__)
    assert result.best == (2, 2) and result.best_score == 3.0 and result.scores == scores
    with pytest.raises(ValueError, match="at least one"):
        best_static_split([], lambda split: 0.0)
