"""Per-request latency metrics of a :class:`~exporters.records.RecordBatch`, vectorised.

This is the one implementation of the latency maths in Goodput (docs/metrics.md states the
definitions; ``exporters._reference`` is the brute-force version the tests compare against).
For a request with arrival ``a``, emissions at ``t1 … tm`` carrying ``k1 … km`` tokens
(``n = Σk``) and phase ``FINISHED`` offset ``f``:

* ``TTFT = t1 − a`` (undefined without emissions);
* ``ITL`` gaps ``t(i+1) − t(i)``, one per emission after the first (a chunk of k tokens
  yields one gap, as ``vllm bench serve`` counts it); none for ``SUMMARY`` records;
* ``TPOT = (E2EL − TTFT)/(n − 1) = (tm − t1)/(n − 1)`` for ``n ≥ 2``, else undefined;
* ``E2EL = tm − a``, or ``f − a`` for a request without emissions (undefined if ``f`` is
  absent too).

A ``SUMMARY`` record of ``n >= 2`` tokens had gaps that it does not carry: its ITL is
*unmeasured* (``RequestLatencies.itl_measured``), not undefined.

Times in a batch are int64 µs offsets after arrival; differences are taken in integer µs
and converted to float seconds with one division, so results are exact up to a single
rounding. Undefined values are NaN. Every function works on whole columns: there is no
Python loop per request or per token.

Example::

    lat = request_latencies(batch)
    slow = lat.ttft_s > 0.2          # NaN compares False: undefined is never "slow"
    p99 = itl_percentile_s(batch, 99.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from exporters.records import Phase, RecordBatch, RecordError, TokenDetail

__all__ = [
    "ItlGroups",
    "RequestLatencies",
    "itl_gaps_s",
    "itl_gaps_us",
    "itl_percentile_s",
    "request_latencies",
]

B = npt.NDArray[np.bool_]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

US_PER_S = 1e6


@dataclass(frozen=True, slots=True)
class RequestLatencies:
    """Latencies of every request of a batch, one entry per row, in float seconds.

    ``ttft_s``, ``tpot_s``, ``e2el_s`` and ``itl_max_s`` are NaN where the metric is
    undefined (see the module docstring). ``output_tokens`` is ``n``; ``num_gaps`` is the
    number of ITL gaps (0 for ``SUMMARY`` records and for requests with < 2 emissions).
    ``itl_measured``: the record carries the request's ITL — ``FULL`` detail, or fewer than
    two output tokens (no gap to carry). A ``SUMMARY`` record of ``n >= 2`` tokens does not:
    its ITL is *unmeasured*, which is not the same as undefined (docs/metrics.md).
    """

    ttft_s: F64
    tpot_s: F64
    e2el_s: F64
    itl_max_s: F64
    output_tokens: I64
    num_gaps: I64
    itl_measured: B

    def __len__(self) -> int:
        return int(self.ttft_s.shape[0])


def request_latencies(
    batch: RecordBatch,
    *,
    validate: bool = True,
    gaps: tuple[I64, I64] | None = None,
) -> RequestLatencies:
    """TTFT, TPOT, E2EL, the largest ITL gap, output tokens and gap count per request.

    With ``validate`` (the default) the batch is first checked with
    :meth:`RecordBatch.validate`, which rejects non-monotonic token times with a
    :class:`~exporters.records.RecordError` naming the request. Pass ``validate=False`` only
    for a batch that was validated already (for example by the wire decoder). ``gaps``:
    :func:`itl_gaps_us` of this same batch, when the caller has them already (the gaps are
    then not taken again).
    """
    if validate:
        batch.validate()
    n = len(batch)
    starts = batch.emission_starts
    offsets = batch.emission_offsets_us
    num_emissions = np.diff(starts)
    has = num_emissions > 0
    first_us = np.zeros(n, dtype=np.int64)
    last_us = np.zeros(n, dtype=np.int64)
    first_us[has] = offsets[starts[:-1][has]]
    last_us[has] = offsets[starts[1:][has] - 1]
    output_tokens = batch.output_tokens()

    ttft_s = np.full(n, np.nan)
    ttft_s[has] = first_us[has] / US_PER_S

    finished_us = batch.phase_offsets_us[:, Phase.FINISHED]
    e2el_s = np.full(n, np.nan)
    e2el_s[has] = last_us[has] / US_PER_S
    # A request that ended without a token (error, abort, empty output) still has an E2EL
    # when its finish time was recorded; -1 (any negative offset) means absent.
    ended = ~has & (finished_us >= 0)
    e2el_s[ended] = finished_us[ended] / US_PER_S

    tpot_s = np.full(n, np.nan)
    multi = has & (output_tokens >= 2)
    # One division of the exact integer span by an exactly representable divisor.
    tpot_s[multi] = (last_us[multi] - first_us[multi]) / (
        (output_tokens[multi] - 1).astype(np.float64) * US_PER_S
    )

    gaps_us, num_gaps = _full_gaps_us(batch) if gaps is None else gaps
    itl_max_s = np.full(n, np.nan)
    if gaps_us.shape[0]:
        # Gaps are grouped by row, in row order: one reduceat over the non-empty groups.
        with_gaps = num_gaps > 0
        group_starts = (np.cumsum(num_gaps) - num_gaps)[with_gaps]
        itl_max_s[with_gaps] = np.maximum.reduceat(gaps_us, group_starts) / US_PER_S
    return RequestLatencies(
        ttft_s=ttft_s,
        tpot_s=tpot_s,
        e2el_s=e2el_s,
        itl_max_s=itl_max_s,
        output_tokens=output_tokens,
        num_gaps=num_gaps,
        itl_measured=(batch.token_detail == TokenDetail.FULL) | (output_tokens < 2),
    )


def itl_gaps_s(batch: RecordBatch, *, validate: bool = True) -> tuple[F64, I64]:
    """All ITL gaps of ``FULL``-detail requests, flattened, and the row each belongs to.

    Gaps come grouped by row in row order, and within a row in emission order.
    """
    if validate:
        batch.validate()
    gaps_us, num_gaps = _full_gaps_us(batch)
    return gaps_us / US_PER_S, _rows_of(num_gaps)


def itl_gaps_us(batch: RecordBatch, *, validate: bool = True) -> tuple[I64, I64]:
    """The ITL gaps of ``FULL``-detail requests in integer µs, and the number per row.

    Gaps come grouped by row in row order (row *i* owns ``num_gaps[i]`` of them), within a
    row in emission order. The exact integers behind :func:`itl_gaps_s`: a caller that needs
    gaps, latencies and percentiles of one batch takes the gaps once and passes them on
    (:func:`request_latencies` ``gaps=``, :meth:`ItlGroups.from_gaps`).
    """
    if validate:
        batch.validate()
    return _full_gaps_us(batch)


def itl_percentile_s(batch: RecordBatch, q: float, *, validate: bool = True) -> F64:
    """Per-request ``q``-th percentile (``0 < q <= 100``) of its ITL gaps; NaN if it has none.

    The definition is numpy's default ``'linear'`` method (type 7 of Hyndman & Fan): with
    the request's ``g`` gaps sorted ascending as ``x[0] … x[g-1]``, the virtual index
    ``h = (g − 1)·q/100``, and the result ``x[⌊h⌋] + (h − ⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋])``,
    evaluated exactly as ``numpy.percentile`` does, so each row equals
    ``np.percentile(gaps_of_that_row, q)`` bit for bit. Vectorised: one sort of all gaps.
    """
    _percent_to_fraction(q)  # reject a bad q before validating the batch
    if validate:
        batch.validate()
    return ItlGroups.of(batch).percentile(q)


def _percent_to_fraction(q: float) -> float:
    if isinstance(q, bool) or not isinstance(q, int | float | np.floating | np.integer):
        raise ValueError(f"q must be a number in (0, 100], got {q!r}")
    if not (math.isfinite(q) and 0.0 < q <= 100.0):
        raise ValueError(f"q must be in (0, 100], got {q}")
    # numpy divides the percentile by 100 in float64 before indexing; so do we.
    return float(np.float64(q) / np.float64(100.0))


def _full_gaps_us(batch: RecordBatch) -> tuple[I64, I64]:
    """Integer µs gaps between consecutive emissions of ``FULL`` rows, and the count per row.

    The gaps come grouped by row in row order (row *i* owns ``num_gaps[i]`` of them).
    """
    num_emissions = np.diff(batch.emission_starts)
    full = batch.token_detail == TokenDetail.FULL
    num_gaps = np.where(full, np.maximum(num_emissions - 1, 0), 0).astype(np.int64)
    m = batch.num_emissions
    if m < 2:
        return np.zeros(0, dtype=np.int64), num_gaps
    # Gap j sits between emissions j and j+1: drop it where j+1 starts a row (the step
    # between two requests) and where the row is not FULL-detail.
    keep = np.ones(m - 1, dtype=np.bool_)
    row_starts = batch.emission_starts[1:-1]
    keep[row_starts[(row_starts > 0) & (row_starts < m)] - 1] = False
    if not full.all():
        keep &= np.repeat(full, num_emissions)[1:]
    gaps_us: I64 = np.diff(batch.emission_offsets_us)[keep]
    return gaps_us, num_gaps


def _rows_of(counts: I64) -> I64:
    """The row index of each item when row *i* owns ``counts[i]`` consecutive items."""
    return np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)


@dataclass(frozen=True, slots=True)
class ItlGroups:
    """The ITL gaps of a batch sorted within each row, ready for any number of percentiles.

    Row *i*'s gaps, ascending, in integer µs, are
    ``sorted_us[group_starts[i]:group_starts[i] + num_gaps[i]]``. Rows are laid out by size
    class with padding between them (see :func:`_sort_within_rows`), so only those slices
    are meaningful. Sorting once lets the judge and the engine evaluate several ITL
    percentiles for the price of one sort.
    """

    sorted_us: npt.NDArray[np.signedinteger]
    group_starts: I64
    num_gaps: I64

    @property
    def sorted_s(self) -> F64:
        """``sorted_us`` in float seconds (same layout)."""
        seconds: F64 = self.sorted_us / US_PER_S
        return seconds

    @classmethod
    def of(cls, batch: RecordBatch) -> ItlGroups:
        """Group an already validated batch's gaps (gap values must be >= 0)."""
        return cls.from_gaps(*_full_gaps_us(batch))

    @classmethod
    def from_gaps(cls, gaps_us: I64, num_gaps: I64) -> ItlGroups:
        """Group gaps as :func:`itl_gaps_us` returns them (of a validated batch)."""
        sorted_us, group_starts = _sort_within_rows(gaps_us, num_gaps)
        return cls(sorted_us, group_starts, num_gaps)

    def percentile(self, q: float) -> F64:
        """Per-row ``q``-th percentile (0 < q <= 100) as :func:`itl_percentile_s` defines it."""
        return self.percentiles([q])[q]

    def percentiles(self, qs: Sequence[float]) -> dict[float, F64]:
        """:meth:`percentile` of each of ``qs``, computed together (one pass per step for
        all of them, not one per percentile)."""
        fractions = np.array([_percent_to_fraction(q) for q in qs], dtype=np.float64)
        n = self.num_gaps.shape[0]
        out = np.full((len(qs), n), np.nan)
        has = self.num_gaps > 0
        if has.any() and len(qs):
            count = self.num_gaps[has]
            base = self.group_starts[has]
            # Row k of each (percentile, row) array is percentile qs[k].
            virtual = (count - 1).astype(np.float64) * fractions[:, np.newaxis]
            lower = np.floor(virtual)
            gamma = virtual - lower
            lo = lower.astype(np.int64)
            # At or past the last element numpy takes the last value on both sides.
            top = virtual >= (count - 1)
            lo[top] = np.broadcast_to(count - 1, lo.shape)[top]
            hi = np.where(top, lo, lo + 1)
            # Gather the integers, then divide: the same floats as dividing every gap first.
            a = self.sorted_us[base + lo] / US_PER_S
            b = self.sorted_us[base + hi] / US_PER_S
            diff = b - a
            # numpy's _lerp: from the nearer end, so the result never leaves [a, b].
            out[:, has] = np.where(gamma >= 0.5, b - diff * (1.0 - gamma), a + diff * gamma)
        return {q: out[k] for k, q in enumerate(qs)}


def _sort_within_rows(values_us: I64, num_values: I64) -> tuple[npt.NDArray[np.signedinteger], I64]:
    """``values_us`` sorted ascending within each row (row *i* owns ``num_values[i]``).

    Returns ``(buffer, row_starts)``: row *i*'s values, sorted, are
    ``buffer[row_starts[i]:row_starts[i] + num_values[i]]``. Each row gets a slot of the
    power of two at or above its length, filled with its values then padding that sorts
    last (the dtype's maximum); slots are laid out by size class, so each class is one
    contiguous 2-D block sorted in place along its rows with one ``np.sort(axis=1)``. numpy
    sorts short rows with SIMD sorting networks, for 32-bit integers up to 512 wide (64-bit:
    256), so the values are int32 whenever they fit. Scattering into the slots is one
    vectorised pass; the Python loop runs once per size class (at most ~60), never per row;
    nothing is gathered back (percentiles read the slots).
    """
    n = num_values.shape[0]
    if values_us.shape[0] == 0:
        return values_us, np.zeros(n, dtype=np.int64)
    low, high = int(values_us.min()), int(values_us.max())
    if low < 0:
        raise RecordError(f"emission_offsets_us: negative ITL gap {low} µs; validate the batch")
    dtype = np.int32 if high <= np.iinfo(np.int32).max else np.int64
    values = values_us.astype(dtype, copy=False)  # a contiguous cast beats a casting scatter
    # Size class: ceil(log2(g)) exactly, from the binary exponent of g - 1 (g < 2**53);
    # 0 for one value; rows without values get no slot.
    exponent = np.frexp(np.maximum(num_values - 1, 0).astype(np.float64))[1].astype(np.int64)
    width = np.where(num_values > 0, np.left_shift(1, exponent), 0)
    order = np.argsort(exponent, kind="stable")
    slot_width = width[order]
    row_starts = np.empty(n, dtype=np.int64)
    row_starts[order] = np.cumsum(slot_width) - slot_width
    buffer: npt.NDArray[np.signedinteger] = np.full(
        int(slot_width.sum()), np.iinfo(dtype).max, dtype=dtype
    )
    # Value j of row i goes to row_starts[i] + j: a running sum of steps, 1 from a value to
    # the next of its row and a jump at each row's first value (one array the size of the
    # values, where a repeat plus an arange took two).
    nonempty = num_values > 0
    firsts = (np.cumsum(num_values) - num_values)[nonempty]
    slot_starts = row_starts[nonempty]
    before = np.empty_like(slot_starts)  # where the value before each row's first one went
    before[:1] = 0
    before[1:] = (slot_starts + num_values[nonempty] - 1)[:-1]
    destination = np.ones(values.shape[0], dtype=np.int64)
    destination[firsts] = slot_starts - before
    np.cumsum(destination, out=destination)
    buffer[destination] = values
    # Each class (one width) is a contiguous block of whole slots: sort its rows in place.
    rows_per_width = np.bincount(exponent[num_values > 1], minlength=64)
    block_start = int(np.count_nonzero(num_values == 1))  # width-1 slots come first
    for e in np.flatnonzero(rows_per_width).tolist():
        size = int(rows_per_width[e]) << e
        buffer[block_start : block_start + size].reshape(-1, 1 << e).sort(axis=1)
        block_start += size
    return buffer, row_starts
