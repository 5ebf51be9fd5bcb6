"""A mergeable latency histogram with a stated relative error (DDSketch-style).

:class:`LatencySketch` counts values in logarithmic buckets of ratio
``γ = (1 + α)/(1 − α)`` with ``α = RELATIVE_ACCURACY = 0.01``. The key layout is fixed for
every sketch (values from ``MIN_VALUE_S = 1e-6`` to ``MAX_VALUE_S = 1e5`` seconds), so a
sketch is just an int64 array of ``NUM_BUCKETS`` counts: two sketches merge by adding their
arrays, and many (per-second ring buffers, per-label series) stack in one 2-D numpy array
whose column sums are again a sketch.

Guarantee: for ``q`` in [0, 1], :meth:`quantile` returns a value within relative error ``α``
of the *exact* quantile of the added values, defined as the value of rank
``r = max(1, ⌈q·n⌉)`` (1-based, ascending; ``⌈·⌉`` forgives 1e-9 of binary rounding in
``q·n``), provided that value lies in ``[MIN_VALUE_S, MAX_VALUE_S]``. Below ``MIN_VALUE_S``
(1 µs, the resolution of our timestamps) values share a zero bucket reported as ``0.0``;
above ``MAX_VALUE_S`` they saturate into the top bucket, reported as about ``MAX_VALUE_S``.

Buckets: index 0 holds ``x < MIN_VALUE_S``; index ``i >= 1`` holds
``UPPER_BOUNDS_S[i − 1] < x <= UPPER_BOUNDS_S[i]`` (index 1 starts at ``MIN_VALUE_S``), and
is represented by ``BUCKET_VALUES_S[i] = 2·γ^k/(γ + 1)`` for its key ``k``, the point whose
relative distance to both ends of ``(γ^(k−1), γ^k]`` is ``α``.

Token times are integer microseconds, so :meth:`LatencySketch.bucket_index_us` indexes
integer-µs values by table lookup (the table is :meth:`bucket_index` itself, evaluated once
on every µs up to about a second): exactly ``bucket_index(values_us / 1e6)``, several times
faster than the logarithm.

Example::

    sketch = LatencySketch()
    sketch.add(latencies.ttft_s)            # NaN (undefined) values are ignored
    p99 = sketch.quantile(0.99)
    ring = np.zeros((60, LatencySketch.NUM_BUCKETS), np.int64)
    ring[second % 60] += LatencySketch.bucket_counts(values_s)
    p99_last_minute = LatencySketch.quantile_from_counts(ring.sum(axis=0), 0.99)
"""

from __future__ import annotations

import math
import struct
import zlib
from typing import ClassVar

import numpy as np
import numpy.typing as npt

__all__ = ["LatencySketch", "SketchError"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

_ALPHA = 0.01
_GAMMA = (1.0 + _ALPHA) / (1.0 - _ALPHA)
_LN_GAMMA = math.log(_GAMMA)
_MIN_VALUE_S = 1e-6
_MAX_VALUE_S = 1e5
_KEY_MIN = math.ceil(math.log(_MIN_VALUE_S) / _LN_GAMMA)  # -690
_KEY_MAX = math.ceil(math.log(_MAX_VALUE_S) / _LN_GAMMA)  # 576
_NUM_BUCKETS = _KEY_MAX - _KEY_MIN + 2  # the zero bucket, then one per key
# Integer-µs values below this are indexed by table (2 MiB of int16); larger ones by log().
_US_TABLE_SIZE = 1 << 20
_US_PER_S = 1e6


def _frozen(array: F64) -> F64:
    array.setflags(write=False)
    return array


_KEYS = np.arange(_KEY_MIN, _KEY_MAX + 1, dtype=np.float64)
# _UPPER[i] is bucket i's inclusive upper edge; _LOWER[i] its exclusive lower edge. Both are
# sentinels (±inf) where the layout saturates, so the fix-up in bucket_counts never moves a
# value out of the zero or top bucket.
_UPPER: F64 = _frozen(np.concatenate(([_MIN_VALUE_S], _GAMMA ** _KEYS[:-1], [np.inf])))
_LOWER: F64 = _frozen(np.concatenate(([-np.inf, -np.inf], _UPPER[1:-1])))
_VALUES: F64 = _frozen(np.concatenate(([0.0], 2.0 * _GAMMA**_KEYS / (_GAMMA + 1.0))))

# Wire format v1, little-endian: header, nnz uint16 bucket indices (strictly increasing),
# nnz counts of `width` bytes (1, 2, 4 or 8: the narrowest that holds the largest), CRC-32
# of everything before it.
_MAGIC = b"GPSK"
_VERSION = 1
_HEADER = struct.Struct("<4sBBHHI")  # magic, version, count width, alpha·1e4, buckets, nnz
_CRC = struct.Struct("<I")
_WIDTHS: dict[int, np.dtype[np.unsignedinteger]] = {
    1: np.dtype("<u1"),
    2: np.dtype("<u2"),
    4: np.dtype("<u4"),
    8: np.dtype("<u8"),
}


class SketchError(ValueError):
    """Bad input to a sketch or undecodable sketch bytes; the message says what and why."""


class LatencySketch:
    """Counts of latency values (float seconds) in a fixed log-bucket layout; see the module.

    ``LatencySketch(counts)`` wraps a copy of an existing counts array (for example a column
    sum of stacked sketches). Equality compares counts.
    """

    RELATIVE_ACCURACY: ClassVar[float] = _ALPHA
    GAMMA: ClassVar[float] = _GAMMA
    MIN_VALUE_S: ClassVar[float] = _MIN_VALUE_S
    MAX_VALUE_S: ClassVar[float] = _MAX_VALUE_S
    NUM_BUCKETS: ClassVar[int] = _NUM_BUCKETS
    UPPER_BOUNDS_S: ClassVar[F64] = _UPPER
    BUCKET_VALUES_S: ClassVar[F64] = _VALUES

    __slots__ = ("_counts",)

    def __init__(self, counts: I64 | None = None) -> None:
        if counts is None:
            self._counts: I64 = np.zeros(_NUM_BUCKETS, dtype=np.int64)
        else:
            self._counts = _checked_counts(counts, "counts")

    @staticmethod
    def bucket_index(values_s: F64) -> I64:
        """The bucket index of each value (NaN and negative values are rejected)."""
        values = np.asarray(values_s, dtype=np.float64)
        if np.isnan(values).any() or (values < 0).any():
            bad = values[np.isnan(values) | (values < 0)][0]
            raise SketchError(f"values_s must be >= 0 and not NaN, got {bad}")
        index = np.zeros(values.shape, dtype=np.int64)
        above = values >= _MIN_VALUE_S
        x = values[above]
        with np.errstate(over="ignore", invalid="ignore"):
            keys = np.ceil(np.log(x) / _LN_GAMMA)
        idx = np.clip(keys - (_KEY_MIN - 1), 1, _NUM_BUCKETS - 1).astype(np.int64)
        # log() may land one bucket off at an edge: settle on the edges table, exactly.
        idx += x > _UPPER[idx]
        idx -= x <= _LOWER[idx]
        index[above] = idx
        return index

    @staticmethod
    def bucket_index_us(values_us: npt.NDArray[np.integer]) -> I64:
        """``bucket_index(values_us / 1e6)``, exactly, for integer microseconds (>= 0).

        Values below 2**20 µs (about 1 s: ITL gaps, most TTFTs) are one table lookup; the
        table is built on first use from :meth:`bucket_index` on the same float values, so
        the two can never disagree. Negative values are rejected like negative seconds.
        """
        values = np.asarray(values_us)
        if values.dtype.kind not in "iu":
            raise SketchError(f"values_us must be integers, got dtype {values.dtype}")
        if values.size == 0:
            return np.zeros(values.shape, dtype=np.int64)
        if values.dtype.kind == "i" and int(values.min()) < 0:
            raise SketchError(f"values_us must be >= 0, got {int(values.min())}")
        table = _us_table()
        if int(values.max()) < _US_TABLE_SIZE:
            return table.take(values).astype(np.int64)
        small = values < _US_TABLE_SIZE
        index = np.empty(values.shape, dtype=np.int64)
        index[small] = table.take(values[small])
        index[~small] = LatencySketch.bucket_index(values[~small] / _US_PER_S)
        return index

    @staticmethod
    def bucket_counts(values_s: F64) -> I64:
        """The counts array of ``values_s`` (NaN ignored; negative values rejected)."""
        values = np.asarray(values_s, dtype=np.float64).ravel()
        values = values[~np.isnan(values)]
        index = LatencySketch.bucket_index(values)
        counts: I64 = np.bincount(index, minlength=_NUM_BUCKETS).astype(np.int64)
        return counts

    @staticmethod
    def quantile_from_counts(counts: I64, q: float) -> float:
        """The ``q``-quantile (0 <= q <= 1) of a counts array; NaN when it is empty."""
        counts = _checked_counts(counts, "counts", copy=False)
        if isinstance(q, bool) or not (isinstance(q, int | float | np.number) and 0 <= q <= 1):
            raise SketchError(f"q must be in [0, 1], got {q!r}")
        cumulative = np.cumsum(counts)
        total = int(cumulative[-1])
        if total == 0:
            return math.nan
        rank = min(total, max(1, math.ceil(float(q) * total - 1e-9)))
        index = int(np.searchsorted(cumulative, rank, side="left"))
        return float(_VALUES[index])

    def add(self, values_s: F64) -> None:
        """Count every value of ``values_s`` (float seconds); NaN (undefined) is ignored."""
        self._counts += self.bucket_counts(values_s)

    def merge(self, other: LatencySketch) -> None:
        """Add ``other``'s counts into this sketch (same layout by construction)."""
        if not isinstance(other, LatencySketch):
            raise SketchError(f"can only merge a LatencySketch, got {type(other).__name__}")
        self._counts += other._counts

    def quantile(self, q: float) -> float:
        """The ``q``-quantile (0 <= q <= 1) within relative error ``α``; NaN when empty."""
        return self.quantile_from_counts(self._counts, q)

    @property
    def count(self) -> int:
        """How many values were added."""
        return int(self._counts.sum())

    @property
    def counts(self) -> I64:
        """The counts array (a read-only view; copy it to change it)."""
        view = self._counts.view()
        view.setflags(write=False)
        return view

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LatencySketch):
            return NotImplemented
        return bool(np.array_equal(self._counts, other._counts))

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"LatencySketch(count={self.count}, p50={self.quantile(0.5):.6g}s)"

    def to_bytes(self) -> bytes:
        """A compact, versioned encoding: the non-zero buckets and their counts, CRC-32."""
        index = np.flatnonzero(self._counts)
        values = self._counts[index]
        largest = int(values.max()) if values.shape[0] else 0
        width = next(w for w in _WIDTHS if largest < 1 << (8 * w))
        body = b"".join(
            (
                _HEADER.pack(
                    _MAGIC,
                    _VERSION,
                    width,
                    round(_ALPHA * 1e4),
                    _NUM_BUCKETS,
                    index.shape[0],
                ),
                index.astype("<u2").tobytes(),
                values.astype(_WIDTHS[width]).tobytes(),
            )
        )
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def from_bytes(cls, data: bytes) -> LatencySketch:
        """Decode :meth:`to_bytes`; raise :class:`SketchError` naming what is wrong."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise SketchError(f"sketch bytes: expected bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) < _HEADER.size + _CRC.size:
            raise SketchError(
                f"sketch bytes: truncated, {len(data)} bytes is shorter than the "
                f"{_HEADER.size + _CRC.size}-byte header and checksum"
            )
        magic, version, width, alpha, buckets, nnz = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise SketchError(f"sketch bytes: bad magic {magic!r}, expected {_MAGIC!r}")
        if version != _VERSION:
            raise SketchError(f"sketch bytes: unsupported version {version}, expected {_VERSION}")
        if width not in _WIDTHS:
            raise SketchError(f"sketch bytes: count width {width}, allowed {list(_WIDTHS)}")
        if (alpha, buckets) != (round(_ALPHA * 1e4), _NUM_BUCKETS):
            raise SketchError(
                f"sketch bytes: layout alpha={alpha / 1e4} buckets={buckets}, this build "
                f"reads alpha={_ALPHA} buckets={_NUM_BUCKETS}"
            )
        expected = _HEADER.size + nnz * (2 + width) + _CRC.size
        if len(data) != expected:
            raise SketchError(
                f"sketch bytes: {len(data)} bytes, expected {expected} for {nnz} buckets"
            )
        (crc,) = _CRC.unpack_from(data, expected - _CRC.size)
        if crc != zlib.crc32(data[: expected - _CRC.size]):
            raise SketchError("sketch bytes: checksum mismatch (corrupted data)")
        index = np.frombuffer(data, dtype="<u2", count=nnz, offset=_HEADER.size).astype(np.int64)
        values = np.frombuffer(
            data, dtype=_WIDTHS[width], count=nnz, offset=_HEADER.size + 2 * nnz
        ).astype(np.uint64)
        if nnz and (int(index[-1]) >= _NUM_BUCKETS or (np.diff(index) <= 0).any()):
            raise SketchError(
                f"sketch bytes: bucket indices must increase strictly below {_NUM_BUCKETS}"
            )
        if (values == 0).any() or (values > np.iinfo(np.int64).max).any():
            raise SketchError("sketch bytes: bucket counts must be in [1, 2**63 - 1]")
        counts = np.zeros(_NUM_BUCKETS, dtype=np.int64)
        counts[index] = values.astype(np.int64)
        sketch = cls.__new__(cls)
        sketch._counts = counts
        return sketch


_us_table_cache: list[npt.NDArray[np.int16]] = []


def _us_table() -> npt.NDArray[np.int16]:
    """The bucket of every integer µs below ``_US_TABLE_SIZE`` (built once, read-only).

    Building twice from two threads is harmless: both results are equal."""
    if not _us_table_cache:
        seconds = np.arange(_US_TABLE_SIZE, dtype=np.int64) / _US_PER_S
        table = LatencySketch.bucket_index(seconds).astype(np.int16)
        table.setflags(write=False)
        _us_table_cache.append(table)
    return _us_table_cache[0]


def _checked_counts(counts: I64, name: str, *, copy: bool = True) -> I64:
    array = np.asarray(counts)
    if array.shape != (_NUM_BUCKETS,):
        raise SketchError(f"{name}: expected shape ({_NUM_BUCKETS},), got {array.shape}")
    if array.dtype.kind not in "iu":
        raise SketchError(f"{name}: expected an integer array, got dtype {array.dtype}")
    if array.shape[0] and int(array.min()) < 0:
        raise SketchError(f"{name}: counts must be >= 0, got {int(array.min())}")
    checked: I64 = array.astype(np.int64, copy=copy)
    return checked
