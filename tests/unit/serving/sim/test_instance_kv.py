"""Instance model: KV block capacity, recompute preemption, and the LRU prefix cache."""

from __future__ import annotations

import math

import numpy as np
import pytest

from serving.sim import LatencyModel, kv_capacity_tokens
from serving.sim.instance import Instance, InstanceConfig, Job, Strategy, serve
from serving.sim.instance._kv import BlockPool

MODEL = LatencyModel.for_profile("h100-llama3.1-8b")


def step_all(inst: Instance, jobs: list[Job]) -> list[Job]:
    """serve(), checking after every event that the KV cache is never overdrawn."""
    order = sorted(jobs, key=lambda j: j.arrival_s)
    done: list[Job] = []
    i = 0
    while i < len(order) or inst.next_event_s < math.inf:
        if i < len(order) and order[i].arrival_s <= inst.next_event_s:
            inst.submit(order[i], order[i].arrival_s)
            i += 1
            if i == len(order):
                inst.close(order[-1].arrival_s)
        else:
            done.extend(inst.step(inst.next_event_s))
        kv = inst.kv
        assert 0 <= kv.free <= kv.capacity
        held = sum(j.blocks for j in inst.running)
        assert held == kv.owned
        assert kv.owned + kv.blocks_per_prefix * kv.cached_prefix_blocks <= kv.capacity
    return done


def test_capacity_defaults_to_what_the_gpu_leaves_after_the_weights() -> None:
    inst = Instance(InstanceConfig(), MODEL)
    tokens = kv_capacity_tokens(MODEL.model, 1)
    assert inst.kv.capacity == tokens // 16
    assert inst.capacity_tokens == tokens // 16 * 16
    assert inst.fits(tokens // 2, tokens // 2 - 16) and not inst.fits(tokens, 16)


@pytest.mark.parametrize("strategy", list(Strategy))
def test_kv_exhaustion_preempts_the_newest_and_loses_no_request(strategy: Strategy) -> None:
    config = InstanceConfig(strategy=strategy, kv_capacity_tokens=2048, batch_size=4)
    inst = Instance(config, MODEL)
    jobs = [Job(i, 0.001 * i, 300, 400) for i in range(6)]  # 6 × 700 tokens > 2048
    done = step_all(inst, jobs)
    assert sorted(j.index for j in done) == list(range(6))
    assert inst.stats.num_preemptions > 0
    preempted = [j for j in jobs if j.num_preemptions]
    assert preempted
    for job in jobs:
        times = job.emission_times()
        assert times.shape[0] == job.generated == 400  # every token exactly once
        assert (np.diff(times) > 0).all()
    # Preempted requests re-ran their prefill over prompt + the tokens they had.
    assert inst.stats.computed_prompt_tokens > sum(j.prompt_tokens for j in jobs)
    assert inst.kv.owned == 0 and inst.kv.free == inst.kv.capacity


def test_the_newest_running_request_is_the_one_preempted() -> None:
    # Together they grow to 1000 tokens of KV; 800 fit.
    inst = Instance(InstanceConfig(strategy=Strategy.CONTINUOUS, kv_capacity_tokens=800), MODEL)
    old, new = Job(0, 0.0, 300, 200), Job(1, 0.0001, 300, 200)
    step_all(inst, [old, new])
    assert (old.num_preemptions, new.num_preemptions) == (0, 1)
    assert old.finished_s < new.finished_s


def test_a_request_that_can_never_fit_is_refused_with_the_numbers() -> None:
    inst = Instance(InstanceConfig(kv_capacity_tokens=1024), MODEL)
    with pytest.raises(
        ValueError, match="needs 1100 tokens of KV cache, more than its capacity of 1024"
    ):
        inst.submit(Job(7, 0.0, 1000, 100), 0.0)


@pytest.mark.parametrize("strategy", [Strategy.CONTINUOUS, Strategy.CHUNKED])
def test_repeated_hash_ids_hit_the_prefix_cache(strategy: Strategy) -> None:
    inst = Instance(InstanceConfig(strategy=strategy), MODEL)
    ids = [11, 12, 13, 14, 15]
    first = Job(0, 0.0, 2100, 2, hash_ids=ids)  # 4 whole 512-token blocks, 52 tokens over
    again = Job(1, 5.0, 2100, 2, hash_ids=ids)
    shares = Job(2, 10.0, 1200, 2, hash_ids=[11, 12, 99])  # two leading blocks in common
    other = Job(3, 15.0, 2100, 2, hash_ids=[21, 22, 23, 24, 25])
    serve(inst, [first, again, shares, other])
    assert [j.cached_tokens for j in (first, again, shares, other)] == [0, 2048, 1024, 0]
    assert inst.stats.cached_tokens == 3072
    # The hit prefills 52 tokens after a 2048-token prefix instead of 2100 tokens.
    prefill = MODEL.profile.prefill
    assert first.emissions[0][0] == pytest.approx(prefill.at(2100.0, 2100.0**2))
    assert again.emissions[0][0] - 5.0 == pytest.approx(prefill.at(52.0, 52.0**2 + 2 * 52 * 2048))


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    inst = Instance(InstanceConfig(), MODEL)
    jobs = [Job(0, 0.0, 1024, 2, hash_ids=[1, 2]), Job(1, 1.0, 1024, 2, hash_ids=[1, 2])]
    serve(inst, jobs)
    assert jobs[1].cached_tokens == 512  # the second block holds the last token
    assert jobs[1].prefill_end_s > jobs[1].prefill_start_s


def test_prefix_cache_evicts_least_recently_used_blocks_when_room_is_needed() -> None:
    # 160 blocks of 16 tokens; each 512-token prefix block takes 32 of them.
    inst = Instance(InstanceConfig(kv_capacity_tokens=2560), MODEL)
    warm = Job(0, 0.0, 1100, 1, hash_ids=[1, 2, 3])  # caches blocks 1, 2
    reuse = Job(1, 1.0, 1100, 1, hash_ids=[1, 2, 3])  # hits, refreshes 1, 2
    filler = Job(2, 2.0, 2100, 1, hash_ids=[7, 8, 9, 10, 11])  # needs room: evicts
    late = Job(3, 3.0, 1100, 1, hash_ids=[1, 2, 3])
    step_all(inst, [warm, reuse, filler, late])
    assert reuse.cached_tokens == 1024
    assert late.cached_tokens < 1024


def test_prefix_cache_can_be_turned_off() -> None:
    inst = Instance(InstanceConfig(prefix_caching=False), MODEL)
    jobs = [
        Job(0, 0.0, 2100, 2, hash_ids=[1, 2, 3, 4, 5]),
        Job(1, 1.0, 2100, 2, hash_ids=[1, 2, 3, 4, 5]),
    ]
    serve(inst, jobs)
    assert [j.cached_tokens for j in jobs] == [0, 0]
    assert inst.kv.cached_prefix_blocks == 0


def test_block_pool_shares_blocks_computed_twice_and_frees_on_release() -> None:
    pool = BlockPool(capacity=100, blocks_per_prefix=32)
    assert pool.allocate(64) and pool.allocate(32)
    pool.insert([5])  # job A's first 32 blocks become the cached block 5
    pool.insert([5])  # job B computed it too: it shares, its copy is freed
    assert (pool.owned, pool.cached_prefix_blocks, pool.free) == (32, 1, 36)
    pool.release_prefix([5])
    pool.release_prefix([5])
    assert pool.available == 68 and pool.free == 36
    assert pool.allocate(60)  # evicts the unread block
    assert pool.cached_prefix_blocks == 0 and pool.free == 8
    assert not pool.allocate(9)
    assert pool.owned == 92
