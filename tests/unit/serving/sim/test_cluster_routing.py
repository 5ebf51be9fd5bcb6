"""Cluster simulator inputs: the router's candidate sets against the live ``choose`` on the
whole fleet, the cluster string, the workload's rate scaling and repetition, the policy
loader."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from exporters.fleet import PoolRole
from serving.gateway.routing import RouteRequest, choose
from serving.sim.cluster import (
    ClusterSpecError,
    NoControl,
    PolicyError,
    Router,
    build_workload,
    load_policy,
    parse_cluster,
)
from serving.sim.cluster.router import DECODE_STREAM_TOKENS
from serving.sim.instance import Strategy
from serving.traces import Trace, TraceError


@pytest.mark.parametrize("colocated", [False, True])
def test_candidate_routing_decides_as_choose_does_on_the_whole_fleet(colocated: bool) -> None:
    rng = random.Random(11)
    for _fleet in range(30):
        n = rng.randint(2, 12)
        if colocated:
            roles = [PoolRole.BOTH] * n
        else:
            roles = [rng.choice(list(PoolRole)) for _ in range(n)]
            roles[0], roles[-1] = PoolRole.PREFILL, PoolRole.DECODE
        ids = [f"i{k}" for k in range(n)]
        router = Router(ids, roles, colocated=colocated)
        for _request in range(60):
            k = rng.randrange(n)
            if rng.random() < 0.5:
                router.add_decode_streams(
                    k, rng.choice([1, 1, -1]) if router.decode_streams[k] else 1
                )
            else:
                router.add_prefill_tokens(k, rng.choice([0, 256, 512, 1000]))
            key = rng.choice([None, "a", "b", "c"])
            if key and rng.random() < 0.3:
                router.pin(key, rng.choice(["", *ids]), rng.choice(ids))
            expected = choose(
                router.states(),
                RouteRequest(
                    prompt_tokens=100,
                    affinity_key=key,
                    affinity=router.affinity,
                    colocated=colocated,
                ),
                0.0,
                decode_stream_tokens=DECODE_STREAM_TOKENS,
            )
            prefill, decode = router.route(100, key, 0.0)
            assert ids[decode] == expected.decode.id
            if colocated:
                assert prefill == -1 and expected.prefill is None
            else:
                assert expected.prefill is not None and ids[prefill] == expected.prefill.id


def test_router_moves_instances_between_pools_and_keeps_their_load() -> None:
    router = Router(
        ["p", "d1", "d2"], [PoolRole.PREFILL, PoolRole.DECODE, PoolRole.DECODE], colocated=False
    )
    router.add_decode_streams(1, 3)
    assert router.route(10, None, 0.0) == (0, 2)
    router.set_roles([PoolRole.PREFILL, PoolRole.DECODE, PoolRole.PREFILL])
    assert router.route(10, None, 0.0) == (0, 1)
    assert router.decode_streams == [0, 3, 0]
    assert router.pool_names == ["prefill", "decode", "prefill"]


def test_affinity_table_keeps_the_most_recent_keys() -> None:
    router = Router(["a", "b"], [PoolRole.BOTH, PoolRole.BOTH], colocated=True)
    router.pin("k", "", "b")
    router.add_decode_streams(1, 1)  # b is busier, but within the affinity slack
    assert router.route(10, "k", 0.0) == (-1, 1)
    assert router.route(10, "other", 0.0) == (-1, 0)
    router.pin(None, "", "a")
    assert list(router.affinity) == ["k"]


def test_parse_cluster_reads_the_issue_example() -> None:
    spec = parse_cluster("prefill=16,decode=48,gpu=h100,model=llama3.1-70b,tp=4")
    assert (spec.num_prefill, spec.num_decode, spec.num_gpus) == (16, 48, 256)
    assert spec.profile == "h100-llama3.1-70b-tp4" and spec.model == "llama-3.1-70b"
    assert spec.instance.strategy is Strategy.CHUNKED and spec.instance.jitter_ratio == 0.02
    assert (spec.node_of(0), spec.node_of(1), spec.node_of(2)) == (0, 0, 1)
    colocated = parse_cluster("model=llama-3.1-8b,strategy=dynamic,batch_size=4", colocated=8)
    assert colocated.colocated and colocated.num_gpus == 8
    assert colocated.instance.strategy is Strategy.DYNAMIC and colocated.instance.batch_size == 4
    assert "8 colocated instances of llama-3.1-8b tp1 on 8 H100 GPUs" in colocated.describe()


@pytest.mark.parametrize(
    ("text", "colocated", "message"),
    [
        ("prefill=1", 0, "a PD cluster needs >= 1 instance in each pool, got prefill=1, decode=0"),
        ("prefill=1,decode=1", 2, "a colocated cluster (--colocated N) has no prefill or decode"),
        ("prefill=1,decode=1,model=gpt-5", 0, "model: unknown model 'gpt-5'; known: llama2-70b"),
        ("prefill=1,decode=1,tp=3", 0, "no fitted profile 'h100-llama3.1-8b-tp3'"),
        ("prefill=1,decode=1,colour=red", 0, "unknown key 'colour'; allowed: ['prefill'"),
        ("prefill=x,decode=1", 0, "prefill: expected an integer, got 'x'"),
        ("prefill=1,decode=1,strategy=greedy", 0, "strategy must be one of ['static', 'dynamic'"),
        ("prefill=1,decode=1,link=carrier-pigeon", 0, "link must be one of ['auto', 'nvlink'"),
        ("prefill=1,decode=1,prefill=2", 0, "prefill is given twice"),
        ("prefill", 0, "expected key=value, got 'prefill'"),
        ("prefill=1,decode=1,max_seqs=0", 0, "max_num_seqs must be an integer >= 1, got 0"),
    ],
)
def test_parse_cluster_errors_name_the_key_and_what_is_allowed(
    text: str, colocated: int, message: str
) -> None:
    with pytest.raises(ClusterSpecError) as caught:
        parse_cluster(text, colocated=colocated)
    assert message in str(caught.value)


def small_trace(hash_ids: list[list[int]] | None = None) -> Trace:
    return Trace(
        np.array([0.0, 1.0, 3.0]), np.array([10, 0, 30]), np.array([1, 2, 0]), hash_ids, name="t"
    )


def test_workload_scales_the_rate_and_repeats_the_trace() -> None:
    work = build_workload(small_trace(), rate_scale=2.0, duration_s=4.0)
    # Scaled arrivals 0, 0.5, 1.5; a cycle lasts 1.5 + one mean gap (0.75) = 2.25 s.
    assert work.arrival_s.tolist() == [0.0, 0.5, 1.5, 2.25, 2.75, 3.75]
    assert work.trace_rows.tolist() == [0, 1, 2, 0, 1, 2]
    assert work.prompt_tokens.tolist() == [10, 1, 30, 10, 1, 30]  # 0 tokens become 1
    assert work.output_tokens.tolist() == [1, 2, 1, 1, 2, 1]
    assert work.hash_ids is None and work.name == "t"


def test_repeated_cycles_get_fresh_prefix_block_ids() -> None:
    work = build_workload(small_trace([[1, 2], [2], [5]]), rate_scale=1.0, duration_s=8.0)
    assert work.hash_ids == [[1, 2], [2], [5], [7, 8], [8], [11]]


def test_workload_start_skips_into_the_trace_and_bad_inputs_say_why() -> None:
    work = build_workload(small_trace(), rate_scale=1.0, duration_s=2.5, start_s=0.5)
    assert work.arrival_s.tolist() == [0.5] and work.trace_rows.tolist() == [0]
    with pytest.raises(TraceError, match="rate_scale: must be a finite number > 0, got 0"):
        build_workload(small_trace(), rate_scale=0, duration_s=1.0)
    with pytest.raises(TraceError, match="duration_s: must be a finite number > 0"):
        build_workload(small_trace(), rate_scale=1.0, duration_s=float("inf"))
    with pytest.raises(TraceError, match="no request after start_s=9 s"):
        build_workload(small_trace(), rate_scale=1.0, duration_s=1.0, start_s=9.0)


def test_load_policy_reads_none_and_module_attributes() -> None:
    assert isinstance(load_policy("none"), NoControl)
    assert isinstance(load_policy("serving.sim.cluster.policy:NoControl"), NoControl)
    with pytest.raises(
        PolicyError, match=re.escape("expected 'none' or 'package.module:attribute'")
    ):
        load_policy("shed-everything")
    with pytest.raises(PolicyError, match=re.escape("cannot load 'serving.sim.cluster:Nothing'")):
        load_policy("serving.sim.cluster:Nothing")
    with pytest.raises(PolicyError, match="is not a SimPolicy"):
        load_policy("serving.sim.cluster:SimOptions")
    with pytest.raises(
        PolicyError, match=re.escape("cannot create 'serving.sim.cluster:Router' with no")
    ):
        load_policy("serving.sim.cluster:Router")
