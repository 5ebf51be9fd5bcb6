"""Engine records built from vLLM's per-iteration stats (serving.vllm_plugin.records)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from exporters.records import Phase, RecordBatch, Status, TokenDetail, Vantage
from serving.vllm_plugin import EngineRecordBuilder, gateway_request_id, status_of

ARRIVAL = 1_795_000_000.123456  # wall-clock seconds, as vLLM's frontend stamps it


@dataclass
class Finished:
    """The fields of vLLM's FinishedRequestStats the builder reads."""

    request_id: str | None = "cmpl-gw-1-0"
    finish_reason: str = "length"
    e2e_latency: float = 0.5
    queued_time: float = 0.01
    prefill_time: float = 0.05
    decode_time: float = 0.4
    num_prompt_tokens: int = 300
    num_generation_tokens: int = 9
    num_cached_tokens: int = 256


def builder() -> EngineRecordBuilder:
    return EngineRecordBuilder(model="tiny", kv_bytes_per_token=2048)


@pytest.mark.parametrize(
    ("engine_id", "gateway_id"),
    [
        ("cmpl-gw-1-0", "gw-1"),
        ("cmpl-gw-1-2", "gw-1-2"),
        ("chatcmpl-gw-7", "gw-7"),
        ("cmpl-", "cmpl-"),
        ("batch-42", "batch-42"),
    ],
)
def test_gateway_request_id(engine_id: str, gateway_id: str) -> None:
    assert gateway_request_id(engine_id) == gateway_id


def test_status_of_finish_reasons() -> None:
    assert status_of("stop") == (Status.OK, "stop")
    assert status_of("length") == (Status.OK, "length")
    assert status_of("abort") == (Status.ABORTED, "abort")
    assert status_of("error") == (Status.ERROR, "error")


def test_record_joins_the_first_token_by_arrival_time() -> None:
    b = builder()
    first_token_time = ARRIVAL + 0.07
    b.observe_first_tokens(first_token_time, [first_token_time - ARRIVAL], external_tokens=256)

    record = b.build(Finished(), iteration_time=ARRIVAL + 0.5)

    assert record.request_id == "gw-1"
    assert record.vantage is Vantage.ENGINE
    assert record.token_detail is TokenDetail.SUMMARY
    assert abs(record.arrival_time_ns - ARRIVAL * 1e9) < 1_000
    assert record.emission_offsets_us.tolist() == [70_000, 500_000]
    assert record.tokens_per_emission().tolist() == [1, 8]
    assert record.output_tokens == 9
    phases = record.phase_offsets_us
    assert [int(phases[p]) for p in Phase] == [10_000, 20_000, 70_000, -1, -1, 500_000]
    assert (record.prompt_tokens, record.cached_tokens) == (300, 256)
    assert record.kv_bytes == 256 * 2048
    assert (record.status, record.reason) == (Status.OK, "length")
    assert record.labels.model == "tiny"
    RecordBatch.from_records([record]).validate()
    assert b.stats().num_ttft_fallbacks == 0 and b.stats().num_pending == 0


def test_external_tokens_shared_by_several_first_tokens_are_not_attributed() -> None:
    b = builder()
    now = ARRIVAL + 1.0
    b.observe_first_tokens(now, [1.0, 0.5], external_tokens=384)

    first = b.build(Finished(e2e_latency=1.2, decode_time=0.2), iteration_time=ARRIVAL + 1.2)
    second = b.build(Finished(e2e_latency=0.7, decode_time=0.2), iteration_time=ARRIVAL + 1.2)

    assert first.kv_bytes == second.kv_bytes == 0
    assert first.emission_offsets_us[0] == 1_000_000
    assert second.emission_offsets_us[0] == 500_000
    assert b.stats().num_unattributed_kv_tokens == 384


def test_several_first_tokens_without_transfer_all_get_zero() -> None:
    b = builder()
    b.observe_first_tokens(ARRIVAL + 1.0, [1.0, 0.5], external_tokens=0)

    record = b.build(Finished(e2e_latency=1.1), iteration_time=ARRIVAL + 1.1)

    assert record.kv_bytes == 0
    assert b.stats().num_unattributed_kv_tokens == 0


def test_unseen_first_token_falls_back_to_e2e_minus_decode_time() -> None:
    b = builder()

    record = b.build(Finished(), iteration_time=ARRIVAL + 0.5)

    assert record.emission_offsets_us.tolist() == [100_000, 500_000]
    assert record.kv_bytes == 0
    assert b.stats().num_ttft_fallbacks == 1


def test_a_single_token_request_has_one_emission() -> None:
    b = builder()
    b.observe_first_tokens(ARRIVAL + 0.05, [0.05], external_tokens=0)

    record = b.build(
        Finished(e2e_latency=0.05, decode_time=0.0, num_generation_tokens=1, prefill_time=0.03),
        iteration_time=ARRIVAL + 0.05,
    )

    assert record.emission_offsets_us.tolist() == [50_000]
    assert record.output_tokens == 1
    assert record.phase_offsets_us[Phase.PREFILL_START] == 20_000


def test_a_request_aborted_before_its_first_token() -> None:
    # Never scheduled: vLLM's intervals are then differences from 0 and meaningless.
    aborted = Finished(
        finish_reason="abort",
        e2e_latency=2.0,
        queued_time=-5.0,
        prefill_time=-1e9,
        decode_time=0.0,
        num_generation_tokens=0,
        num_cached_tokens=0,
    )

    record = builder().build(aborted, iteration_time=ARRIVAL + 2.0)

    assert (record.status, record.reason) == (Status.ABORTED, "abort")
    assert record.output_tokens == 0
    assert [int(record.phase_offsets_us[p]) for p in Phase] == [-1, -1, -1, -1, -1, 2_000_000]
    RecordBatch.from_records([record]).validate()


def test_phases_are_clamped_into_order() -> None:
    # Engine-core intervals longer than the frontend's TTFT (clocks differ a little).
    record = builder().build(
        Finished(prefill_time=0.2, queued_time=0.3, e2e_latency=0.5, decode_time=0.4),
        iteration_time=ARRIVAL + 0.5,
    )

    phases = record.phase_offsets_us
    assert phases[Phase.PREFILL_END] == 100_000
    assert phases[Phase.PREFILL_START] == -1  # not placeable before the first token
    assert phases[Phase.QUEUED] == -1


def test_first_tokens_of_requests_that_never_finish_are_bounded() -> None:
    b = EngineRecordBuilder(model="tiny", kv_bytes_per_token=0, max_pending=3)
    for i in range(5):
        b.observe_first_tokens(ARRIVAL + i, [0.5], external_tokens=0)

    assert b.stats().num_pending == 3
    assert b.stats().num_evicted == 2
