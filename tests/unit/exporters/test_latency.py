"""Per-request latencies: exact agreement with the pure-Python reference, and the edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporters._reference import (
    reference_gaps_s,
    reference_latencies,
    reference_percentile,
)
from exporters.latency import (
    ItlGroups,
    itl_gaps_s,
    itl_gaps_us,
    itl_percentile_s,
    request_latencies,
)
from exporters.records import (
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
    """One record: 0..6 emissions (often equal times), chunks of k >= 1, any detail/status."""
    num = draw(st.sampled_from([0, 1, 1, 2, 3, 6]))
    steps = draw(st.lists(st.integers(0, 3) | st.integers(0, 200_000), min_size=num, max_size=num))
    offsets = np.cumsum(np.array(steps, dtype=np.int64)) + draw(st.integers(0, 2_000_000))
    tokens = draw(st.none() | st.lists(st.integers(1, 5), min_size=num, max_size=num))
    phases = np.full(6, -1, dtype=np.int64)
    phases[Phase.FINISHED] = draw(st.sampled_from([-1, 0, 1, 999_999, 5_000_000]))
    return RequestRecord(
        request_id=f"r{index}",
        vantage=Vantage.GATEWAY,
        arrival_time_ns=0,
        emission_offsets_us=offsets.astype(np.int64),
        emission_tokens=None if tokens is None else np.array(tokens, dtype=np.int32),
        token_detail=draw(st.sampled_from(TokenDetail)),
        phase_offsets_us=phases,
        status=draw(st.sampled_from(Status)),
        final=draw(st.booleans()),
    )


@st.composite
def record_lists(draw: st.DrawFn) -> list[RequestRecord]:
    size = draw(st.integers(0, 12))
    return [draw(records(i)) for i in range(size)]


percents = st.sampled_from([100.0, 50.0, 99.0, 99.9, 25.0, 1e-9, 33.3]) | st.floats(
    min_value=1e-6, max_value=100.0
)


@settings(deadline=None, max_examples=300)
@given(record_lists())
def test_request_latencies_equal_the_reference_exactly(recs: list[RequestRecord]) -> None:
    lat = request_latencies(RecordBatch.from_records(recs))
    assert len(lat) == len(recs)
    want = [reference_latencies(r) for r in recs]
    np.testing.assert_array_equal(lat.ttft_s, [w.ttft_s for w in want])
    np.testing.assert_array_equal(lat.tpot_s, [w.tpot_s for w in want])
    np.testing.assert_array_equal(lat.e2el_s, [w.e2el_s for w in want])
    np.testing.assert_array_equal(lat.itl_max_s, [w.itl_max_s for w in want])
    assert lat.output_tokens.tolist() == [w.output_tokens for w in want]
    assert lat.num_gaps.tolist() == [w.num_gaps for w in want]
    for arr in (lat.ttft_s, lat.tpot_s, lat.e2el_s, lat.itl_max_s):
        assert arr.dtype == np.float64
    assert lat.output_tokens.dtype == np.int64
    assert lat.num_gaps.dtype == np.int64


@settings(deadline=None, max_examples=300)
@given(record_lists(), percents)
def test_itl_percentile_equals_the_reference_and_numpy(recs: list[RequestRecord], q: float) -> None:
    got = itl_percentile_s(RecordBatch.from_records(recs), q)
    assert got.shape == (len(recs),)
    for value, rec in zip(got.tolist(), recs, strict=True):
        gaps = reference_gaps_s(rec)
        want = reference_percentile(gaps, q)
        if not gaps:
            assert math.isnan(value)
            continue
        assert value == want
        assert value == float(np.percentile(np.array(gaps), q))


@settings(deadline=None)
@given(record_lists())
def test_itl_gaps_are_the_reference_gaps_grouped_by_row(recs: list[RequestRecord]) -> None:
    gaps, rows = itl_gaps_s(RecordBatch.from_records(recs))
    want_gaps = [g for r in recs for g in reference_gaps_s(r)]
    want_rows = [i for i, r in enumerate(recs) for _ in reference_gaps_s(r)]
    assert gaps.tolist() == want_gaps
    assert rows.tolist() == want_rows


def _rec(
    offsets: list[int],
    tokens: list[int] | None = None,
    detail: TokenDetail = TokenDetail.FULL,
    finished_us: int = -1,
    request_id: str = "r",
) -> RequestRecord:
    phases = np.full(6, -1, dtype=np.int64)
    phases[Phase.FINISHED] = finished_us
    return RequestRecord(
        request_id=request_id,
        vantage=Vantage.GATEWAY,
        arrival_time_ns=0,
        emission_offsets_us=np.array(offsets, dtype=np.int64),
        emission_tokens=None if tokens is None else np.array(tokens, dtype=np.int32),
        token_detail=detail,
        phase_offsets_us=phases,
    )


def test_worked_example_with_a_multi_token_chunk() -> None:
    # Emissions at 100 ms (1 token), 130 ms (3 tokens), 190 ms (1 token): n = 5, 2 gaps.
    lat = request_latencies(
        RecordBatch.from_records([_rec([100_000, 130_000, 190_000], [1, 3, 1])])
    )
    assert lat.ttft_s.tolist() == [0.1]
    assert lat.e2el_s.tolist() == [0.19]
    assert lat.tpot_s.tolist() == [0.09 / 4]  # (E2EL - TTFT) / (n - 1), vLLM bench's TPOT
    assert lat.itl_max_s.tolist() == [0.06]
    assert lat.output_tokens.tolist() == [5]
    assert lat.num_gaps.tolist() == [2]


def test_one_token_has_ttft_and_e2el_but_no_tpot_or_itl() -> None:
    lat = request_latencies(RecordBatch.from_records([_rec([250_000])]))
    assert lat.ttft_s.tolist() == [0.25]
    assert lat.e2el_s.tolist() == [0.25]
    assert math.isnan(lat.tpot_s[0])
    assert math.isnan(lat.itl_max_s[0])
    assert lat.num_gaps.tolist() == [0]


def test_one_chunk_of_several_tokens_has_zero_tpot_and_no_gap() -> None:
    lat = request_latencies(RecordBatch.from_records([_rec([250_000], [4])]))
    assert lat.tpot_s.tolist() == [0.0]
    assert math.isnan(lat.itl_max_s[0])


def test_no_tokens_uses_the_finish_time_for_e2el_else_undefined() -> None:
    batch = RecordBatch.from_records([_rec([], finished_us=40_000), _rec([], finished_us=-1)])
    lat = request_latencies(batch)
    assert math.isnan(lat.ttft_s[0]) and math.isnan(lat.ttft_s[1])
    assert lat.e2el_s[0] == 0.04
    assert math.isnan(lat.e2el_s[1])
    assert np.isnan(lat.tpot_s).all()
    assert lat.output_tokens.tolist() == [0, 0]


def test_finish_time_is_ignored_when_there_are_emissions() -> None:
    lat = request_latencies(RecordBatch.from_records([_rec([10_000, 20_000], finished_us=99_000)]))
    assert lat.e2el_s.tolist() == [0.02]


def test_summary_records_have_tpot_but_no_itl() -> None:
    rec = _rec([200_000, 1_200_000], [1, 100], detail=TokenDetail.SUMMARY)
    batch = RecordBatch.from_records([rec])
    lat = request_latencies(batch)
    assert lat.ttft_s.tolist() == [0.2]
    assert lat.tpot_s.tolist() == [1.0 / 100]
    assert lat.e2el_s.tolist() == [1.2]
    assert math.isnan(lat.itl_max_s[0])
    assert lat.num_gaps.tolist() == [0]
    assert math.isnan(itl_percentile_s(batch, 99.0)[0])
    gaps, rows = itl_gaps_s(batch)
    assert gaps.size == 0 and rows.size == 0


def test_equal_timestamps_give_zero_gaps() -> None:
    batch = RecordBatch.from_records([_rec([5, 5, 5])])
    lat = request_latencies(batch)
    assert lat.itl_max_s.tolist() == [0.0]
    assert lat.tpot_s.tolist() == [0.0]
    assert itl_percentile_s(batch, 50.0).tolist() == [0.0]


def test_percentile_interpolates_linearly_within_a_request() -> None:
    # Gaps 10, 20, 30, 40 ms: p50 sits halfway between 20 and 30 ms.
    batch = RecordBatch.from_records([_rec([0, 10_000, 30_000, 60_000, 100_000])])
    assert itl_percentile_s(batch, 50.0).tolist() == [0.025]
    assert itl_percentile_s(batch, 100.0).tolist() == [0.04]
    assert itl_percentile_s(batch, 1e-9)[0] == pytest.approx(0.01)


def test_empty_batch_gives_empty_columns() -> None:
    batch = RecordBatch.empty()
    lat = request_latencies(batch)
    assert lat.ttft_s.shape == lat.num_gaps.shape == (0,)
    assert itl_percentile_s(batch, 99.0).shape == (0,)
    gaps, rows = itl_gaps_s(batch)
    assert gaps.shape == rows.shape == (0,)


def test_huge_gaps_stay_exact() -> None:
    big = 2**61
    recs = [_rec([0, big, big + 5, big + 7], request_id="a"), _rec([3, 4, big], request_id="b")]
    batch = RecordBatch.from_records(recs)
    for q in (10.0, 50.0, 99.0):
        want = [reference_percentile(reference_gaps_s(r), q) for r in recs]
        assert itl_percentile_s(batch, q).tolist() == want


def test_non_monotonic_token_times_are_rejected_naming_the_request() -> None:
    batch = RecordBatch.from_records(
        [_rec([1, 2], request_id="ok"), _rec([10, 30, 20], request_id="bad")]
    )
    message = "emission_offsets_us: non-monotonic token times in request 'bad' at emission 2"
    with pytest.raises(RecordError) as err:
        request_latencies(batch)
    assert str(err.value) == message
    with pytest.raises(RecordError) as err:
        itl_percentile_s(batch, 99.0)
    assert str(err.value) == message
    with pytest.raises(RecordError) as err:
        itl_gaps_s(batch)
    assert str(err.value) == message


def test_unvalidated_negative_gap_cannot_be_sorted_silently() -> None:
    batch = RecordBatch.from_records([_rec([10, 30, 20])])
    with pytest.raises(RecordError) as err:
        itl_percentile_s(batch, 50.0, validate=False)
    assert str(err.value) == ("emission_offsets_us: negative ITL gap -10 µs; validate the batch")


@pytest.mark.parametrize("q", [0.0, -1.0, 100.5, math.nan, math.inf])
def test_percentile_out_of_range_is_rejected(q: float) -> None:
    batch = RecordBatch.from_records([_rec([1, 2, 3])])
    with pytest.raises(ValueError) as err:
        itl_percentile_s(batch, q)
    assert str(err.value) == f"q must be in (0, 100], got {q}"


@pytest.mark.parametrize("q", [True, "99", None])
def test_percentile_must_be_a_number(q: object) -> None:
    batch = RecordBatch.from_records([_rec([1, 2, 3])])
    with pytest.raises(ValueError) as err:
        itl_percentile_s(batch, q)  # type: ignore[arg-type]
    assert str(err.value) == f"q must be a number in (0, 100], got {q!r}"


@settings(deadline=None)
@given(record_lists(), st.lists(percents, min_size=1, max_size=3))
def test_itl_groups_serve_several_percentiles_from_one_sort(
    recs: list[RequestRecord], qs: list[float]
) -> None:
    batch = RecordBatch.from_records(recs)
    groups = ItlGroups.of(batch)
    assert groups.num_gaps.tolist() == [len(reference_gaps_s(r)) for r in recs]
    for q in qs:
        np.testing.assert_array_equal(groups.percentile(q), itl_percentile_s(batch, q))


# -- long requests, wide values, and the shared-gaps API -------------------------------------


def _long_batch(lengths: list[int], seed: int, scale_us: int = 40_000) -> RecordBatch:
    """Requests with ``lengths[i]`` emissions each; gaps drawn with many ties."""
    rng = np.random.default_rng(seed)
    records = []
    for i, length in enumerate(lengths):
        gaps = rng.integers(0, scale_us, size=max(length - 1, 0)) // 7 * 7
        offsets = 1_000 + np.concatenate(([0], np.cumsum(gaps))) if length else []
        records.append(_rec(list(np.asarray(offsets, dtype=np.int64)), request_id=f"r{i}"))
    return RecordBatch.from_records(records)


@pytest.mark.parametrize(
    ("lengths", "scale_us"),
    [
        ([0, 1, 2, 3, 600, 1500, 5000, 257, 513, 1025, 2], 40_000),  # every size class
        ([3000, 40, 3000], 2**33),  # gaps beyond int32: sorted as int64
        ([2] * 50 + [1] * 5, 1_000_000),
    ],
)
def test_percentiles_of_long_requests_equal_numpy(lengths: list[int], scale_us: int) -> None:
    batch = _long_batch(lengths, seed=len(lengths), scale_us=scale_us)
    groups = ItlGroups.of(batch)
    qs = [50.0, 90.0, 95.0, 99.0, 99.9, 100.0, 1e-9, 33.3]
    together = groups.percentiles(qs)
    gaps, rows = itl_gaps_s(batch)
    for q in qs:
        got = groups.percentile(q)
        np.testing.assert_array_equal(together[q], got)
        for row, length in enumerate(lengths):
            mine = gaps[rows == row]
            if length < 2:
                assert math.isnan(got[row])
            else:
                assert got[row] == float(np.percentile(mine, q)), (row, q)
    # The sorted slices are the rows' gaps, ascending, in integer µs.
    for row in range(len(lengths)):
        start, count = int(groups.group_starts[row]), int(groups.num_gaps[row])
        want = np.sort(np.round(gaps[rows == row] * 1e6).astype(np.int64))
        np.testing.assert_array_equal(groups.sorted_us[start : start + count], want)
        np.testing.assert_array_equal(groups.sorted_s[start : start + count], want / 1e6)


@settings(deadline=None)
@given(record_lists())
def test_gaps_in_microseconds_feed_the_latencies_and_the_groups(
    recs: list[RequestRecord],
) -> None:
    batch = RecordBatch.from_records(recs)
    gaps_us, num_gaps = itl_gaps_us(batch)
    gaps_s, rows = itl_gaps_s(batch)
    assert gaps_us.dtype == np.int64
    np.testing.assert_array_equal(gaps_us / 1e6, gaps_s)
    assert np.repeat(np.arange(len(recs)), num_gaps).tolist() == rows.tolist()
    shared = request_latencies(batch, gaps=(gaps_us, num_gaps))
    alone = request_latencies(batch)
    for name in ("ttft_s", "tpot_s", "e2el_s", "itl_max_s", "output_tokens", "num_gaps"):
        np.testing.assert_array_equal(getattr(shared, name), getattr(alone, name))
    from_gaps = ItlGroups.from_gaps(gaps_us, num_gaps)
    for q in (50.0, 99.0):
        np.testing.assert_array_equal(from_gaps.percentile(q), itl_percentile_s(batch, q))


def test_percentiles_of_no_percentile_and_of_rows_without_gaps() -> None:
    batch = RecordBatch.from_records([_rec([5]), _rec([])])
    groups = ItlGroups.of(batch)
    assert groups.percentiles([]) == {}
    assert np.isnan(groups.percentiles([50.0])[50.0]).all()
    with pytest.raises(ValueError) as err:
        groups.percentiles([50.0, 101.0])
    assert str(err.value) == "q must be in (0, 100], got 101.0"
