"""The RecordBatch contract: round trips, take, concat and the validation errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporters.records import (
    LABEL_KEYS,
    NUM_PHASES,
    LabelColumn,
    Labels,
    Phase,
    RecordBatch,
    RecordError,
    RequestRecord,
    Status,
    TokenDetail,
    Vantage,
)


@st.composite
def records(draw: st.DrawFn, index: int) -> RequestRecord:
    num = draw(st.integers(0, 5))
    steps = draw(st.lists(st.integers(0, 50_000), min_size=num, max_size=num))
    offsets = np.cumsum(np.array(steps, dtype=np.int64)) + draw(st.integers(0, 10**6))
    tokens = draw(st.none() | st.lists(st.integers(1, 4), min_size=num, max_size=num))
    phases = np.array(draw(st.lists(st.integers(-1, 10**6), min_size=6, max_size=6)), np.int64)
    return RequestRecord(
        request_id=f"r{index}",
        vantage=draw(st.sampled_from(Vantage)),
        arrival_time_ns=draw(st.integers(0, 2**62)),
        labels=Labels(*draw(st.lists(st.sampled_from(["", "a", "b"]), min_size=5, max_size=5))),
        emission_offsets_us=offsets.astype(np.int64),
        emission_tokens=None if tokens is None else np.array(tokens, dtype=np.int32),
        token_detail=draw(st.sampled_from(TokenDetail)),
        phase_offsets_us=phases,
        kv_bytes=draw(st.integers(0, 2**40)),
        prompt_tokens=draw(st.integers(0, 10_000)),
        cached_tokens=draw(st.integers(0, 10_000)),
        status=draw(st.sampled_from(Status)),
        reason=draw(st.sampled_from(["", "timeout", "oom"])),
        final=draw(st.booleans()),
    )


@st.composite
def record_lists(draw: st.DrawFn, max_size: int = 8) -> list[RequestRecord]:
    size = draw(st.integers(0, max_size))
    return [draw(records(i)) for i in range(size)]


def assert_same_record(got: RequestRecord, want: RequestRecord) -> None:
    assert got.request_id == want.request_id
    assert got.vantage == want.vantage
    assert got.arrival_time_ns == want.arrival_time_ns
    assert got.labels == want.labels
    np.testing.assert_array_equal(got.emission_offsets_us, want.emission_offsets_us)
    np.testing.assert_array_equal(got.tokens_per_emission(), want.tokens_per_emission())
    assert got.output_tokens == want.output_tokens
    assert got.token_detail == want.token_detail
    np.testing.assert_array_equal(got.phase_offsets_us, want.phase_offsets_us)
    assert (got.kv_bytes, got.prompt_tokens, got.cached_tokens) == (
        want.kv_bytes,
        want.prompt_tokens,
        want.cached_tokens,
    )
    assert (got.status, got.reason, got.final) == (want.status, want.reason, want.final)


@settings(deadline=None)
@given(record_lists())
def test_from_records_then_records_round_trips(recs: list[RequestRecord]) -> None:
    batch = RecordBatch.from_records(recs)
    batch.validate()
    assert len(batch) == len(recs)
    assert batch.output_tokens().tolist() == [r.output_tokens for r in recs]
    back = list(batch.records())
    assert len(back) == len(recs)
    for got, want in zip(back, recs, strict=True):
        assert_same_record(got, want)


@settings(deadline=None)
@given(record_lists(), st.data())
def test_take_selects_rows_by_mask_and_by_index(
    recs: list[RequestRecord], data: st.DataObject
) -> None:
    batch = RecordBatch.from_records(recs)
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(recs), max_size=len(recs))))
    picked = batch.take(mask.astype(np.bool_))
    picked.validate()
    want = [r for r, keep in zip(recs, mask.tolist(), strict=True) if keep]
    for got, expected in zip(picked.records(), want, strict=True):
        assert_same_record(got, expected)
    assert len(picked) == len(want)
    if recs:
        idx = data.draw(st.lists(st.integers(0, len(recs) - 1), max_size=6))
        by_index = batch.take(np.array(idx, dtype=np.int64))
        by_index.validate()
        assert by_index.request_ids == [recs[i].request_id for i in idx]
        for got, i in zip(by_index.records(), idx, strict=True):
            assert_same_record(got, recs[i])


@settings(deadline=None)
@given(st.lists(record_lists(max_size=4), max_size=4))
def test_concat_keeps_all_rows_in_order(parts: list[list[RequestRecord]]) -> None:
    batches = [RecordBatch.from_records(p) for p in parts]
    joined = RecordBatch.concat(batches)
    joined.validate()
    flat = [r for p in parts for r in p]
    assert len(joined) == len(flat)
    for got, want in zip(joined.records(), flat, strict=True):
        assert_same_record(got, want)


def test_output_tokens_past_int32_are_summed_in_int64() -> None:
    # Three emissions of 2**30 tokens: the row's sum (3 * 2**30) does not fit int32.
    record = RequestRecord(
        request_id="big",
        vantage=Vantage.GATEWAY,
        arrival_time_ns=10**18,
        emission_offsets_us=np.array([1, 2, 3], dtype=np.int64),
        emission_tokens=np.full(3, 2**30, dtype=np.int32),
    )
    batch = RecordBatch.from_records([record, record])
    assert batch.output_tokens().tolist() == [3 * 2**30, 3 * 2**30]
    assert batch.output_tokens().dtype == np.int64


def test_empty_batch_is_valid_and_has_no_rows() -> None:
    batch = RecordBatch.empty()
    batch.validate()
    assert len(batch) == 0
    assert batch.num_emissions == 0
    assert batch.output_tokens().tolist() == []
    assert batch.emission_starts.tolist() == [0]
    assert set(batch.labels) == set(LABEL_KEYS)


def test_label_column_encodes_decodes_and_masks() -> None:
    column = LabelColumn.encode(["a", "b", "a", ""])
    assert column.values == ["a", "b", ""]
    assert column.codes.tolist() == [0, 1, 0, 2]
    assert column.decode() == ["a", "b", "a", ""]
    assert column.mask("a").tolist() == [True, False, True, False]
    assert column.mask("missing").tolist() == [False, False, False, False]


def _batch() -> RecordBatch:
    return RecordBatch.from_records(
        [
            RequestRecord("r0", Vantage.GATEWAY, 0, emission_offsets_us=np.array([5, 9, 12])),
            RequestRecord("r1", Vantage.ENGINE, 0, emission_offsets_us=np.array([3, 8, 20])),
        ]
    )


def test_validate_names_the_request_with_non_monotonic_token_times() -> None:
    batch = _batch()
    batch.emission_offsets_us[5] = 7  # r1: 3, 8, 7
    with pytest.raises(RecordError) as err:
        batch.validate()
    assert str(err.value) == (
        "emission_offsets_us: non-monotonic token times in request 'r1' at emission 2"
    )


def test_validate_allows_times_to_restart_at_a_request_boundary() -> None:
    batch = _batch()  # r0 ends at 12, r1 starts at 3
    batch.validate()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: setattr(b, "status", b.status[:1]), "status: expected 2 rows, got 1"),
        (
            lambda b: setattr(b, "emission_tokens", b.emission_tokens[:4]),
            "emission_tokens: expected 6 rows, got 4",
        ),
        (
            lambda b: setattr(b, "emission_starts", np.array([0, 3, 5, 6])),
            "emission_starts: expected 3 rows, got 4",
        ),
        (lambda b: b.labels.pop("tenant"), "labels.tenant: missing label column"),
        (
            lambda b: setattr(b.labels["model"], "codes", np.array([0, 3], np.uint32)),
            "labels.model: code out of range of 1",
        ),
        (
            lambda b: setattr(b.reason, "codes", np.array([0], np.uint32)),
            "labels.reason: expected 2 rows, got 1",
        ),
        (
            lambda b: setattr(b, "phase_offsets_us", np.zeros((2, 3), np.int64)),
            f"phase_offsets_us: expected shape (2, {NUM_PHASES}), got (2, 3)",
        ),
        (
            lambda b: setattr(b, "emission_starts", np.array([0, 3, 5])),
            "emission_starts: must run from 0 to 6",
        ),
        (
            lambda b: b.emission_offsets_us.__setitem__(0, -1),
            "emission_offsets_us: offsets must be >= 0 (after arrival)",
        ),
        (
            lambda b: b.emission_tokens.__setitem__(1, 0),
            "emission_tokens: every emission carries >= 1 token",
        ),
        (
            lambda b: b.status.__setitem__(0, 9),
            "status/vantage: allowed values are "
            "['IN_FLIGHT', 'OK', 'ERROR', 'ABORTED', 'REJECTED'] / ['GATEWAY', 'ENGINE']",
        ),
        (
            lambda b: b.token_detail.__setitem__(1, 2),
            "token_detail: allowed values are ['FULL', 'SUMMARY']",
        ),
    ],
)
def test_validate_errors_name_the_field(mutate: object, message: str) -> None:
    batch = _batch()
    mutate(batch)  # type: ignore[operator]
    with pytest.raises(RecordError) as err:
        batch.validate()
    assert str(err.value) == message


def test_validate_rejects_decreasing_emission_starts() -> None:
    batch = _batch()
    batch.emission_starts = np.array([0, 7, 6], dtype=np.int64)
    with pytest.raises(RecordError) as err:
        batch.validate()
    assert str(err.value) == "emission_starts: must be non-decreasing"


def test_phase_offsets_default_to_absent() -> None:
    rec = RequestRecord("r", Vantage.GATEWAY, 0)
    assert rec.phase_offsets_us.tolist() == [-1] * NUM_PHASES
    assert int(rec.phase_offsets_us[Phase.FINISHED]) == -1
    assert rec.output_tokens == 0
