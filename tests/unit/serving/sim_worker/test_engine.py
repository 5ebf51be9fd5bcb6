"""The sim engine in real time: the instance model's schedule, kept on the wall clock."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serving.sim import LatencyModel
from serving.sim.instance import Instance, InstanceConfig, Job, JobMode, Strategy, serve
from serving.sim.worker.engine import SimEngine, SimRequest, TooLongError
from serving.sim.worker.prompts import PromptInfo, parse_completion_prompt, word_prompt

PROFILE = "h100-llama3.1-8b"
LATENCY = LatencyModel.for_profile(PROFILE)


def prompt(n: int, key: int = 0) -> PromptInfo:
    return parse_completion_prompt({"prompt": word_prompt(n, key)}, block_tokens=512)


async def finish(request: SimRequest, timeout_s: float = 10.0) -> None:
    async def wait() -> None:
        while not request.done:
            request.event.clear()
            await request.event.wait()

    await asyncio.wait_for(wait(), timeout_s)


async def test_one_request_gets_its_tokens_on_the_modelled_schedule() -> None:
    engine = SimEngine(LATENCY, InstanceConfig(jitter_ratio=0.0))
    engine.start()
    seen: list[tuple[int, float]] = []
    request = engine.submit("r", prompt(1000), max_tokens=20, output_tokens=20)
    while not request.done:
        request.event.clear()
        await asyncio.wait_for(request.event.wait(), 5.0)
        seen.append((request.seen, engine.now()))
    times = request.job.emission_times() - request.arrival_s
    # The modelled schedule: the prefill iteration makes token 1, then one decode step each.
    prefill = LATENCY.prefill_s([1000])
    assert times[0] == pytest.approx(prefill, rel=1e-9)
    steps = np.diff(times)
    expected = [LATENCY.decode_step_s(1, 1000 + k) for k in range(19)]
    np.testing.assert_allclose(steps, expected, rtol=1e-9)
    # Wall clock: each token is released no earlier than its modelled time, and late by
    # no more than the loop's lag (generous: the test machine is shared).
    for count, wall in seen:
        modelled = request.job.emission_times()[count - 1]
        assert wall >= modelled - 1e-6
        assert wall - modelled < 0.25, (count, wall, modelled)
    assert request.finish_reason == "length"
    assert engine.counters.generation_tokens == 20
    assert engine.counters.prompt_tokens == engine.counters.local_compute_tokens == 1000
    engine.close()


MIXED = [(900, 30), (3000, 12), (200, 40), (1500, 25), (50, 8), (700, 20)]


@pytest.mark.parametrize(
    ("config", "sizes"),
    [
        (InstanceConfig(max_num_seqs=4, max_num_batched_tokens=2048, jitter_ratio=0.02), MIXED),
        # A KV cache this small preempts (recompute) while the batch decodes.
        (InstanceConfig(kv_capacity_tokens=1024, jitter_ratio=0.02), [(300, 100)] * 4),
        (InstanceConfig(strategy=Strategy.CONTINUOUS, max_num_seqs=3, jitter_ratio=0.02), MIXED),
    ],
    ids=["chunked", "preempting", "continuous"],
)
async def test_same_arrivals_give_the_offline_instance_models_token_times(
    config: InstanceConfig, sizes: list[tuple[int, int]]
) -> None:
    """Real time changes when requests arrive, never what the model does with them."""
    engine = SimEngine(LATENCY, config, seed=5)
    engine.start()
    requests = []
    for k, (n, out) in enumerate(sizes):
        requests.append(engine.submit(f"r{k}", prompt(n, k), max_tokens=out, output_tokens=out))
        await asyncio.sleep(0.004 * (k % 3))
    await asyncio.gather(*(finish(r) for r in requests))
    offline = Instance(engine.config, LATENCY, seed=5)
    jobs = [
        Job(k, r.arrival_s, r.job.prompt_tokens, r.job.output_tokens, hash_ids=r.job.hash_ids)
        for k, r in enumerate(requests)
    ]
    serve(offline, jobs, close=False)
    for request, job in zip(requests, jobs, strict=True):
        np.testing.assert_array_equal(request.job.emission_times(), job.emission_times())
    assert engine.counters.preemptions == offline.stats.num_preemptions
    if config.kv_capacity_tokens:
        assert engine.counters.preemptions > 0
    engine.close()


async def test_a_full_batch_queues_the_next_request_until_a_seat_frees() -> None:
    engine = SimEngine(LATENCY, InstanceConfig(max_num_seqs=1, jitter_ratio=0.0))
    engine.start()
    first = engine.submit("a", prompt(100, 1), max_tokens=10, output_tokens=10)
    second = engine.submit("b", prompt(100, 2), max_tokens=10, output_tokens=10)
    await asyncio.sleep(0)
    assert engine.load.num_requests_running == 1 and engine.load.num_requests_waiting == 1
    await asyncio.gather(finish(first), finish(second))
    # The second prefill starts at the first request's last token.
    assert second.job.prefill_start_s == first.job.finished_s
    assert engine.load.idle
    engine.close()


async def test_a_transferred_kv_arrives_after_the_modelled_transfer_and_skips_prefill() -> None:
    engine = SimEngine(LATENCY, InstanceConfig(jitter_ratio=0.0), link="rdma-400g")
    engine.start()
    request = engine.submit("d", prompt(4000), max_tokens=5, output_tokens=5, remote_kv=True)
    assert request.job.mode is JobMode.DECODE
    assert engine.load.num_requests_waiting == 1  # loading its KV
    await finish(request)
    transfer = engine.transfer_s(4000)
    assert transfer == pytest.approx(
        engine.link.setup_s + 4000 * LATENCY.kv_bytes_per_token_per_gpu / engine.link.bytes_per_s
    )
    assert request.job.kv_end_s - request.arrival_s == pytest.approx(transfer, abs=1e-9)
    first = request.job.emission_times()[0] - request.job.kv_end_s
    assert first == pytest.approx(LATENCY.decode_step_s(1, 4000), rel=1e-9)
    c = engine.counters
    assert c.external_kv_tokens == 4000 and c.local_compute_tokens == 0
    assert request.cached_tokens == 4000
    engine.close()


async def test_abort_removes_a_queued_request_and_ends_a_running_one_next_iteration() -> None:
    engine = SimEngine(LATENCY, InstanceConfig(max_num_seqs=1, jitter_ratio=0.0))
    engine.start()
    running = engine.submit("a", prompt(100, 1), max_tokens=500, output_tokens=500)
    queued = engine.submit("b", prompt(100, 2), max_tokens=500, output_tokens=500)
    await asyncio.sleep(0.05)
    engine.abort(queued)
    assert queued.done and queued.finish_reason == "abort" and queued.seen == 0
    before = running.seen
    engine.abort(running)
    await finish(running)
    assert running.finish_reason == "abort"
    assert running.seen <= before + 2  # the iteration in flight, at most one more
    assert engine.counters.finished == {"abort": 2}
    engine.close()


async def test_a_request_that_cannot_fit_the_kv_cache_is_refused() -> None:
    engine = SimEngine(LATENCY, InstanceConfig(kv_capacity_tokens=1024))
    engine.start()
    with pytest.raises(TooLongError, match="KV capacity of 1024 tokens"):
        engine.submit("x", prompt(1000), max_tokens=100, output_tokens=100)
    engine.close()
