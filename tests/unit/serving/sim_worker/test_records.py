"""Engine-vantage records of a sim worker: the vLLM plugin's builder fed by the engine."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from exporters.records import Phase, Status, TokenDetail, Vantage
from exporters.sinks import InMemorySink
from serving.sim import LatencyModel
from serving.sim.instance import InstanceConfig
from serving.sim.worker.engine import SimEngine, SimRequest
from serving.sim.worker.prompts import parse_completion_prompt, word_prompt
from serving.sim.worker.records import EngineRecords

LATENCY = LatencyModel.for_profile("h100-llama3.1-8b")


async def finish(request: SimRequest) -> None:
    while not request.done:
        request.event.clear()
        await asyncio.wait_for(request.event.wait(), 10.0)


async def test_one_record_per_leg_with_modelled_times_and_the_transferred_kv() -> None:
    engine = SimEngine(LATENCY, InstanceConfig(jitter_ratio=0.0))
    sink = InMemorySink()
    EngineRecords(engine, sink, model="llama-3.1-8b").attach()
    engine.start()
    prompt = parse_completion_prompt({"prompt": word_prompt(1500, 1)}, block_tokens=512)
    local = engine.submit("r1-prefill", prompt, max_tokens=1, output_tokens=1)
    await finish(local)
    remote = engine.submit("r1", prompt, max_tokens=9, output_tokens=9, remote_kv=True)
    await finish(remote)
    prefill_record, decode_record = sink.records
    assert (prefill_record.request_id, decode_record.request_id) == ("r1-prefill", "r1")
    for record in (prefill_record, decode_record):
        assert record.vantage == Vantage.ENGINE and record.status == Status.OK
        assert record.token_detail == TokenDetail.SUMMARY
        assert record.labels.model == "llama-3.1-8b" and record.prompt_tokens == 1500
    # The prefill leg: one token at its modelled prefill end, nothing transferred.
    ttft_us = prefill_record.emission_offsets_us[0]
    assert ttft_us == pytest.approx(LATENCY.prefill_s([1500]) * 1e6, abs=2)
    assert prefill_record.phase_offsets_us[Phase.PREFILL_END] == ttft_us
    assert prefill_record.kv_bytes == 0 and prefill_record.cached_tokens == 0
    # The decode leg: 1 + 8 tokens, the whole prompt's KV transferred.
    assert decode_record.emission_tokens is not None
    assert decode_record.emission_tokens.tolist() == [1, 8]
    first = engine.transfer_s(1500) + LATENCY.decode_step_s(1, 1500)
    assert decode_record.emission_offsets_us[0] == pytest.approx(first * 1e6, abs=2)
    assert decode_record.kv_bytes == 1500 * engine.kv_bytes_per_token
    assert decode_record.cached_tokens == 1500
    # Arrival on the wall clock: the engine's origin plus the virtual arrival.
    arrival_s = engine.wall_at_zero_s + remote.arrival_s
    assert decode_record.arrival_time_ns == pytest.approx(arrival_s * 1e9, abs=2_000)
    engine.close()


async def test_the_kv_sink_gets_the_modelled_handoff_and_the_shipped_record_does_not() -> None:
    engine = SimEngine(LATENCY, InstanceConfig(jitter_ratio=0.0))
    shipped, kv = InMemorySink(), InMemorySink()
    EngineRecords(engine, shipped, model="llama-3.1-8b", kv_sink=kv).attach()
    engine.start()
    prompt = parse_completion_prompt({"prompt": word_prompt(1500, 1)}, block_tokens=512)
    await finish(engine.submit("r1-prefill", prompt, max_tokens=1, output_tokens=1))
    await finish(engine.submit("r1", prompt, max_tokens=9, output_tokens=9, remote_kv=True))
    prefill_record, decode_record = shipped.records
    (handoff,) = kv.records  # the decode leg only: the prefill leg received nothing
    assert handoff.request_id == "r1" and handoff.kv_bytes == decode_record.kv_bytes > 0
    phases = handoff.phase_offsets_us
    assert phases[Phase.KV_HANDOFF_START] == 0
    assert phases[Phase.KV_HANDOFF_END] == pytest.approx(engine.transfer_s(1500) * 1e6, abs=2)
    assert phases[Phase.FINISHED] == decode_record.phase_offsets_us[Phase.FINISHED]
    others = [p for p in Phase if p not in (Phase.KV_HANDOFF_START, Phase.KV_HANDOFF_END,
                                            Phase.FINISHED)]  # fmt: skip
    assert (phases[others] == -1).all()
    # Shipped as a vLLM worker ships it: no engine-side hand-off phases, in order.
    for record in (prefill_record, decode_record):
        shipped_phases = record.phase_offsets_us
        assert shipped_phases[Phase.KV_HANDOFF_START] == shipped_phases[Phase.KV_HANDOFF_END] == -1
        present = shipped_phases[shipped_phases >= 0]
        assert (np.diff(present) >= 0).all()
    engine.close()
