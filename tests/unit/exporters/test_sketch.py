"""LatencySketch: the stated relative error, merging, the layout and the byte encoding."""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporters._reference import reference_quantile_lower
from exporters.sketch import LatencySketch, SketchError

ALPHA = LatencySketch.RELATIVE_ACCURACY
# The guarantee is alpha; the bound is evaluated in float64, which adds ~1e-16 relative.
SLACK = 1e-12

in_range = st.floats(min_value=LatencySketch.MIN_VALUE_S, max_value=LatencySketch.MAX_VALUE_S)
latencies = st.lists(in_range | st.sampled_from([1e-6, 0.05, 0.2, 1.0]), min_size=1, max_size=300)
quantiles = st.sampled_from([0.0, 0.5, 0.9, 0.99, 0.999, 1.0]) | st.floats(0.0, 1.0)


def sketch_of(values: list[float]) -> LatencySketch:
    sketch = LatencySketch()
    sketch.add(np.array(values, dtype=np.float64))
    return sketch


def test_the_stated_relative_accuracy_is_one_percent() -> None:
    assert ALPHA == 0.01
    assert pytest.approx(1.01 / 0.99) == LatencySketch.GAMMA
    assert (LatencySketch.MIN_VALUE_S, LatencySketch.MAX_VALUE_S) == (1e-6, 1e5)


@settings(deadline=None, max_examples=300)
@given(latencies, quantiles)
def test_quantile_is_within_alpha_of_the_exact_lower_quantile(
    values: list[float], q: float
) -> None:
    exact = reference_quantile_lower(values, q)
    estimate = sketch_of(values).quantile(q)
    assert abs(estimate - exact) <= (ALPHA + SLACK) * exact


@settings(deadline=None)
@given(latencies, latencies)
def test_merge_equals_the_sketch_of_the_concatenation(a: list[float], b: list[float]) -> None:
    merged = sketch_of(a)
    merged.merge(sketch_of(b))
    assert merged == sketch_of(a + b)
    assert merged.count == len(a) + len(b)
    stacked = np.stack([LatencySketch.bucket_counts(np.array(v)) for v in (a, b)])
    assert LatencySketch(stacked.sum(axis=0)) == merged
    for q in (0.0, 0.5, 0.99, 1.0):
        assert LatencySketch.quantile_from_counts(stacked.sum(axis=0), q) == merged.quantile(q)


@settings(deadline=None)
@given(st.lists(st.floats(0.0, 1e7) | st.just(math.nan), max_size=200))
def test_bytes_round_trip(values: list[float]) -> None:
    sketch = sketch_of(values)
    data = sketch.to_bytes()
    back = LatencySketch.from_bytes(data)
    assert back == sketch
    assert back.count == sum(not math.isnan(v) for v in values)
    assert LatencySketch.from_bytes(bytearray(data)) == sketch
    assert LatencySketch.from_bytes(memoryview(data)) == sketch


@pytest.mark.parametrize("largest", [1, 255, 256, 65_535, 65_536, 2**32, 2**63 - 1])
def test_bytes_round_trip_for_every_count_width(largest: int) -> None:
    counts = np.zeros(LatencySketch.NUM_BUCKETS, dtype=np.int64)
    counts[[0, 7, LatencySketch.NUM_BUCKETS - 1]] = [1, largest, 3]
    sketch = LatencySketch(counts)
    data = sketch.to_bytes()
    width = 1 if largest < 2**8 else 2 if largest < 2**16 else 4 if largest < 2**32 else 8
    assert len(data) == 14 + 3 * (2 + width) + 4  # header, indices, counts, CRC
    assert LatencySketch.from_bytes(data) == sketch


def test_encoding_is_sparse() -> None:
    empty = LatencySketch().to_bytes()
    assert len(empty) == 18
    assert LatencySketch.from_bytes(empty) == LatencySketch()
    assert len(sketch_of([0.1] * 1000 + [0.2] * 1000).to_bytes()) == 18 + 2 * (2 + 2)


@settings(deadline=None)
@given(st.lists(in_range, min_size=1, max_size=50), st.data())
def test_any_changed_byte_is_rejected(values: list[float], data: st.DataObject) -> None:
    encoded = bytearray(sketch_of(values).to_bytes())
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(SketchError):
        LatencySketch.from_bytes(bytes(encoded))


@settings(deadline=None)
@given(st.lists(in_range, min_size=1, max_size=50), st.data())
def test_truncated_or_extended_bytes_are_rejected(values: list[float], data: st.DataObject) -> None:
    encoded = sketch_of(values).to_bytes()
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(SketchError):
        LatencySketch.from_bytes(encoded[:cut])
    with pytest.raises(SketchError):
        LatencySketch.from_bytes(encoded + b"\0")


def _sealed(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


def _header(
    magic: bytes = b"GPSK",
    version: int = 1,
    width: int = 1,
    alpha: int = 100,
    buckets: int = LatencySketch.NUM_BUCKETS,
    nnz: int = 0,
) -> bytes:
    return struct.pack("<4sBBHHI", magic, version, width, alpha, buckets, nnz)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            b"GPSK",
            "sketch bytes: truncated, 4 bytes is shorter than the 18-byte header and checksum",
        ),
        (_sealed(_header(magic=b"XXXX")), "sketch bytes: bad magic b'XXXX', expected b'GPSK'"),
        (_sealed(_header(version=2)), "sketch bytes: unsupported version 2, expected 1"),
        (_sealed(_header(width=3)), "sketch bytes: count width 3, allowed [1, 2, 4, 8]"),
        (
            _sealed(_header(alpha=200)),
            "sketch bytes: layout alpha=0.02 buckets=1268, "
            "this build reads alpha=0.01 buckets=1268",
        ),
        (_sealed(_header(nnz=2)), "sketch bytes: 18 bytes, expected 24 for 2 buckets"),
        (_header() + b"\0\0\0\0", "sketch bytes: checksum mismatch (corrupted data)"),
        (
            _sealed(_header(nnz=2) + struct.pack("<HH", 5, 5) + b"\1\1"),
            "sketch bytes: bucket indices must increase strictly below 1268",
        ),
        (
            _sealed(_header(nnz=1) + struct.pack("<H", 1268) + b"\1"),
            "sketch bytes: bucket indices must increase strictly below 1268",
        ),
        (
            _sealed(_header(nnz=1) + struct.pack("<H", 3) + b"\0"),
            "sketch bytes: bucket counts must be in [1, 2**63 - 1]",
        ),
        (
            _sealed(_header(width=8, nnz=1) + struct.pack("<HQ", 3, 2**63)),
            "sketch bytes: bucket counts must be in [1, 2**63 - 1]",
        ),
    ],
)
def test_malformed_bytes_are_rejected_with_the_reason(data: bytes, message: str) -> None:
    with pytest.raises(SketchError) as err:
        LatencySketch.from_bytes(data)
    assert str(err.value) == message


def test_from_bytes_needs_bytes() -> None:
    with pytest.raises(SketchError) as err:
        LatencySketch.from_bytes("GPSK")  # type: ignore[arg-type]
    assert str(err.value) == "sketch bytes: expected bytes, got str"


def test_layout_edges_increase_and_representatives_sit_within_alpha() -> None:
    upper = LatencySketch.UPPER_BOUNDS_S
    values = LatencySketch.BUCKET_VALUES_S
    assert upper.shape == values.shape == (LatencySketch.NUM_BUCKETS,)
    assert upper[0] == LatencySketch.MIN_VALUE_S and upper[-1] == math.inf
    assert (np.diff(upper) > 0).all()
    assert upper[-2] < LatencySketch.MAX_VALUE_S <= upper[-2] * LatencySketch.GAMMA
    assert values[0] == 0.0
    hi = upper[1:-1]
    lo = np.concatenate(([LatencySketch.MIN_VALUE_S], upper[1:-2]))
    rep = values[1:-1]
    assert ((rep - lo) <= (ALPHA + SLACK) * lo).all()
    assert ((hi - rep) <= (ALPHA + SLACK) * hi).all()
    assert not upper.flags.writeable and not values.flags.writeable


def test_edges_are_inclusive_upper_bounds() -> None:
    upper = LatencySketch.UPPER_BOUNDS_S[1:-1]
    index = LatencySketch.bucket_index(upper)
    assert index.tolist() == list(range(1, LatencySketch.NUM_BUCKETS - 1))
    after = LatencySketch.bucket_index(np.nextafter(upper, math.inf))
    assert after.tolist() == list(range(2, LatencySketch.NUM_BUCKETS))


def test_small_values_share_the_zero_bucket_and_large_ones_saturate() -> None:
    sketch = sketch_of([0.0, 1e-7, 9.99e-7])
    assert sketch.counts[0] == 3 and sketch.quantile(1.0) == 0.0
    assert LatencySketch.bucket_index(np.array([1e-6])).tolist() == [1]
    top = LatencySketch.BUCKET_VALUES_S[-1]
    huge = sketch_of([1e5, 1e6, 1e300, math.inf])
    assert huge.counts[-1] == 4
    assert huge.quantile(0.0) == huge.quantile(1.0) == top
    assert abs(top - 1e5) <= ALPHA * 1e5


def test_nan_is_ignored_and_empty_is_nan() -> None:
    sketch = sketch_of([math.nan, math.nan])
    assert sketch.count == 0
    assert math.isnan(sketch.quantile(0.5))
    assert math.isnan(LatencySketch().quantile(0.99))
    assert LatencySketch.bucket_counts(np.array([math.nan, 0.2])).sum() == 1


def test_negative_values_are_rejected() -> None:
    with pytest.raises(SketchError) as err:
        LatencySketch().add(np.array([0.1, -0.5]))
    assert str(err.value) == "values_s must be >= 0 and not NaN, got -0.5"


@pytest.mark.parametrize("q", [-0.1, 1.5, math.nan, True, "0.5"])
def test_quantile_must_be_in_the_unit_interval(q: object) -> None:
    with pytest.raises(SketchError) as err:
        sketch_of([0.1]).quantile(q)  # type: ignore[arg-type]
    assert str(err.value) == f"q must be in [0, 1], got {q!r}"


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (np.zeros(3, np.int64), "counts: expected shape (1268,), got (3,)"),
        (np.zeros((2, 1268), np.int64), "counts: expected shape (1268,), got (2, 1268)"),
        (np.zeros(1268, np.float64), "counts: expected an integer array, got dtype float64"),
        (np.full(1268, -1, np.int64), "counts: counts must be >= 0, got -1"),
    ],
)
def test_counts_are_validated(counts: np.ndarray, message: str) -> None:
    with pytest.raises(SketchError) as err:
        LatencySketch(counts)
    assert str(err.value) == message
    with pytest.raises(SketchError):
        LatencySketch.quantile_from_counts(counts, 0.5)


def test_counts_are_copied_in_and_read_only_out() -> None:
    counts = np.zeros(LatencySketch.NUM_BUCKETS, dtype=np.int64)
    sketch = LatencySketch(counts)
    counts[5] = 9
    assert sketch.count == 0
    with pytest.raises(ValueError):
        sketch.counts[5] = 1
    sketch.add(np.array([0.25]))
    assert sketch.count == 1


def test_merge_needs_a_sketch() -> None:
    with pytest.raises(SketchError) as err:
        LatencySketch().merge(np.zeros(LatencySketch.NUM_BUCKETS))  # type: ignore[arg-type]
    assert str(err.value) == "can only merge a LatencySketch, got ndarray"


def test_rank_convention_is_lower_with_rounding_forgiven() -> None:
    values = [float(i) / 1000 for i in range(1, 101)]  # 1 ms .. 100 ms
    sketch = sketch_of(values)
    # rank ceil(0.07 * 100) = 7 even though 0.07 * 100 == 7.000000000000001 in binary
    assert reference_quantile_lower(values, 0.07) == 0.007
    assert abs(sketch.quantile(0.07) - 0.007) <= ALPHA * 0.007
    assert reference_quantile_lower(values, 0.0) == 0.001
    assert reference_quantile_lower(values, 0.995) == 0.1


# -- integer microseconds -------------------------------------------------------------------

TABLE_EDGE = 1 << 20  # values below are looked up in the table, above go through log()
microseconds = (
    st.integers(0, 5_000)
    | st.integers(0, TABLE_EDGE + 10)
    | st.integers(TABLE_EDGE - 3, TABLE_EDGE + 3)
    | st.integers(0, 10**11)
)


@settings(deadline=None, max_examples=300)
@given(st.lists(microseconds, max_size=200))
def test_bucket_index_us_equals_bucket_index_of_the_seconds(values: list[int]) -> None:
    array = np.array(values, dtype=np.int64)
    got = LatencySketch.bucket_index_us(array)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, LatencySketch.bucket_index(array / 1e6))


def test_bucket_index_us_on_every_bucket_edge_of_the_table() -> None:
    # Each µs just below, at and above each bucket edge within the table's range.
    upper = LatencySketch.UPPER_BOUNDS_S[:-1] * 1e6
    edges = np.floor(upper[upper < TABLE_EDGE]).astype(np.int64)
    values = np.unique(np.concatenate((edges - 1, edges, edges + 1, [0, 1, TABLE_EDGE - 1])))
    values = values[values >= 0]
    np.testing.assert_array_equal(
        LatencySketch.bucket_index_us(values), LatencySketch.bucket_index(values / 1e6)
    )
    for dtype in (np.int32, np.uint16, np.uint64):
        small = values[values < 60_000].astype(dtype)
        np.testing.assert_array_equal(
            LatencySketch.bucket_index_us(small), LatencySketch.bucket_index(small / 1e6)
        )


def test_bucket_index_us_refuses_negative_and_non_integer_values() -> None:
    with pytest.raises(SketchError) as err:
        LatencySketch.bucket_index_us(np.array([5, -3], dtype=np.int64))
    assert str(err.value) == "values_us must be >= 0, got -3"
    with pytest.raises(SketchError) as err:
        LatencySketch.bucket_index_us(np.array([0.5]))
    assert str(err.value) == "values_us must be integers, got dtype float64"
    assert LatencySketch.bucket_index_us(np.zeros(0, dtype=np.int64)).shape == (0,)
