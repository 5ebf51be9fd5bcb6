"""One ingested batch, prepared once for every SLO: rows in finish order, with latencies,
bucket indices, ITL percentiles and verdicts shared between the SLOs that need them.

Per batch the metric core runs once: the ITL gaps are taken once (integer µs) and feed the
latencies, one sort for every ITL percentile any SLO or the dry-run store needs, and the
gaps' sketch and Prometheus buckets (one table lookup on the integer µs). Per SLO the
engine only masks rows and counts them. Row columns are reordered by finish second, so
each SLO's rows come grouped by slot and sums per slot are one ``reduceat``; emissions
are never reordered (per-gap arrays keep the batch's row order, reached by ``gap_start``).
What the SLOs' selections add to their sketches is then counted for all of them at once
(:mod:`controlplane.goodput._sketch_adds`), once per distinct selection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controlplane.goodput._judge import judge_values, status_batch
from controlplane.goodput.spec import SLOSpec
from exporters import buckets
from exporters.latency import ItlGroups, RequestLatencies, itl_gaps_us, request_latencies
from exporters.records import LabelColumn, RecordBatch, RecordError, Status
from exporters.sketch import LatencySketch
from exporters.slo import Objective, Verdicts

__all__ = [
    "E2EL",
    "FUTURE_TOLERANCE_S",
    "ITL",
    "LATE_HORIZON_S",
    "METRICS",
    "PROM_OF_CODE",
    "RING_S",
    "TPOT",
    "TTFT",
    "BatchView",
    "gap_codes",
    "gap_positions",
    "prom_index",
]

B = npt.NDArray[np.bool_]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
#: Gap codes: int16 from the lookup table, int64 past it.
Codes = npt.NDArray[np.int16] | I64
U8 = npt.NDArray[np.uint8]

#: Sketch metrics, in the order of every (metric, bucket) array in the engine.
METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
TTFT, TPOT, ITL, E2EL = range(4)
#: The 1-second counter ring's span: finish times older than this are "late".
RING_S = 3600
#: Finish times older than this (before the engine clock) are dropped and counted: their
#: minute can no longer be re-emitted as a complete rollup.
LATE_HORIZON_S = 7200
#: Finish times further ahead of the engine clock than this are dropped and counted.
FUTURE_TOLERANCE_S = 60
_NS_PER_S = 1_000_000_000
_US_PER_S = 1e6


def gap_positions(gap_start: I64, num_gaps: I64) -> I64:
    """Positions in the flat gap array of the gaps of rows with these starts and counts."""
    total = int(num_gaps.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.cumsum(num_gaps) - num_gaps
    positions: I64 = np.repeat(gap_start - offsets, num_gaps) + np.arange(total, dtype=np.int64)
    return positions


def _prom_table() -> tuple[I64, B]:
    """Per sketch bucket: its Prometheus bucket, and whether a Prometheus bound lies
    strictly inside it (then values in it need their own search)."""
    upper = LatencySketch.UPPER_BOUNDS_S
    lower = np.concatenate(([-np.inf], upper[:-1]))
    bounds = np.asarray(buckets.LATENCY_BUCKETS_S)
    # For v in (lower, upper] with no bound strictly inside, #bounds < v = #bounds <= lower.
    at_lower = np.searchsorted(bounds, lower, side="right").astype(np.int64)
    straddles = np.searchsorted(bounds, upper, side="left") > at_lower
    return at_lower, straddles


_PROM_OF_SKETCH, _STRADDLES = _prom_table()


def prom_index(values: F64, sketch_index: I64) -> I64:
    """``exporters.buckets.bucket_index(values)``, exactly, from the values' sketch buckets:
    a table lookup, with a search only for values in the few sketch buckets that a
    Prometheus bound splits."""
    out: I64 = _PROM_OF_SKETCH.take(sketch_index)
    split = _STRADDLES.take(sketch_index)
    if split.any():
        out[split] = buckets.bucket_index(values[split])
    return out


# A gap's *code* is ``2 * sketch bucket + above``, where ``above`` says whether it lies above
# the Prometheus bound inside its sketch bucket (bounds are >= 20 % apart, sketch buckets
# 2 %: at most one inside each). One code gives both buckets, so counting the codes of a
# batch's gaps counts both histograms at once. PROM_OF_CODE: the Prometheus bucket of a code.
# (A code "above" in a bucket no bound splits never occurs; it maps within range anyway.)
PROM_OF_CODE: I64 = np.minimum(
    np.stack((_PROM_OF_SKETCH, _PROM_OF_SKETCH + 1), axis=1).ravel(),
    len(buckets.LATENCY_BUCKETS_S),
)
_CODE_TABLE_SIZE = 1 << 20  # integer µs coded by table lookup (2 MiB of int16), about 1 s
_code_table_cache: list[npt.NDArray[np.int16]] = []


def _gap_codes_of(gaps_us: I64) -> I64:
    """The codes of integer-µs gaps from the sketch's and Prometheus' own bucket functions
    (exactly ``bucket_index(gaps_us / 1e6)`` of each)."""
    sketch = LatencySketch.bucket_index_us(gaps_us)
    prom = prom_index(gaps_us / _US_PER_S, sketch)
    above = prom - _PROM_OF_SKETCH.take(sketch)
    assert ((above == 0) | (above == 1)).all(), "two Prometheus bounds in one sketch bucket"
    codes: I64 = 2 * sketch + above
    return codes


def gap_codes(gaps_us: I64) -> Codes:
    """:func:`_gap_codes_of` by table lookup below ``_CODE_TABLE_SIZE`` µs (the table is
    built on first use from the same function, so the two never disagree). The table's
    codes stay int16: widening them would be one more array the size of the gaps (a fresh
    mmap per batch under the start-up allocator setting, controlplane/allocator.py); the
    keys computed from them are int64."""
    if not _code_table_cache:
        table = _gap_codes_of(np.arange(_CODE_TABLE_SIZE, dtype=np.int64)).astype(np.int16)
        table.setflags(write=False)
        _code_table_cache.append(table)
    if gaps_us.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    low = int(gaps_us.min())
    if low < 0:  # an unvalidated batch: never index the table with it
        raise RecordError(f"emission_offsets_us: negative ITL gap {low} µs; validate the batch")
    if int(gaps_us.max()) < _CODE_TABLE_SIZE:
        codes: Codes = _code_table_cache[0].take(gaps_us)
        return codes
    return _gap_codes_of(gaps_us)


def _sketch_and_prom(values: F64) -> tuple[I64, I64]:
    """Sketch and Prometheus bucket per value, ``-1`` where the value is undefined (NaN)."""
    sketch = np.full(values.shape, -1, dtype=np.int64)
    prom = np.full(values.shape, -1, dtype=np.int64)
    defined = ~np.isnan(values)
    if defined.any():
        sketch[defined] = LatencySketch.bucket_index(values[defined])
        prom[defined] = prom_index(values[defined], sketch[defined])
    return sketch, prom


@dataclass(slots=True)
class BatchView:
    """A batch's rows in finish-second order, with everything the SLOs share.

    Row columns (``request_ids`` … ``labels``, the latencies and everything per row) are in
    finish order. ``sec``: finish second (arrival + E2EL; arrival when E2EL is undefined),
    ascending. ``accepted``: final rows whose finish lies within the late horizon and the
    future tolerance of ``now_s``. Status masks (``ok`` …) cover final rows only.
    ``row_index`` / ``prom_index``: (3, n) sketch / Prometheus bucket of TTFT, TPOT, E2EL
    (``-1`` where undefined). ``gap_codes``: the ITL gaps of FULL rows coded with their
    sketch and Prometheus buckets (:func:`gap_codes`), in the *batch's* row order; row *i*
    (finish order) owns ``num_gaps[i]`` of them from ``gap_start[i]``. ``row_gap_sum_us``:
    the sum of each row's gaps (its last emission minus its first, exact).
    ``itl_percentiles``: per-row ITL percentile values.
    """

    request_ids: list[str]
    vantage: U8
    status: U8
    final: B
    labels: dict[str, LabelColumn]
    latencies: RequestLatencies
    now_s: int
    sec: I64
    finish_s: F64
    accepted: B
    ok: B
    err: B
    aborted: B
    rejected: B
    judged: B
    tokens: I64
    row_values: F64
    row_index: I64
    prom_index: I64
    gap_codes: Codes
    row_gap_sum_us: I64
    gap_start: I64
    num_gaps: I64
    itl_percentiles: dict[float, F64]
    num_late: int
    num_dropped_late: int
    num_dropped_future: int
    _masks: dict[tuple[str, str], B] = field(default_factory=dict)
    _verdicts: dict[tuple[Objective, ...], Verdicts] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        batch: RecordBatch,
        now: float,
        *,
        validate: bool,
        itl_percentiles: Iterable[float],
    ) -> BatchView:
        """Prepare ``batch`` (validated first when ``validate``); ``itl_percentiles`` are
        the per-request ITL percentiles to compute (only those: the sort is skipped when
        none is asked for)."""
        gaps_us, num_gaps = itl_gaps_us(batch, validate=validate)
        latencies = request_latencies(batch, validate=False, gaps=(gaps_us, num_gaps))
        finish_ns = (
            batch.arrival_time_ns
            + np.where(np.isnan(latencies.e2el_s), 0, np.rint(latencies.e2el_s * 1e6)).astype(
                np.int64
            )
            * 1000
        )
        sec = finish_ns // _NS_PER_S
        n = len(batch)
        wanted = sorted(set(itl_percentiles))
        percentiles: dict[float, F64] = {}
        if wanted and gaps_us.shape[0]:
            percentiles = ItlGroups.from_gaps(gaps_us, num_gaps).percentiles(wanted)
        elif wanted:
            percentiles = {q: np.full(n, np.nan) for q in wanted}
        gap_start = np.cumsum(num_gaps) - num_gaps
        starts, offsets = batch.emission_starts, batch.emission_offsets_us
        row_gap_sum_us = np.zeros(n, dtype=np.int64)
        with_gaps = num_gaps > 0  # then the row has >= 2 emissions
        row_gap_sum_us[with_gaps] = (
            offsets[starts[1:][with_gaps] - 1] - offsets[starts[:-1][with_gaps]]
        )
        request_ids, vantage, status = batch.request_ids, batch.vantage, batch.status
        final, labels = batch.final, batch.labels
        if n > 1 and (sec[1:] < sec[:-1]).any():
            # Reorder the row columns only; the emissions and gaps stay where they are.
            order = np.argsort(sec, kind="stable")
            latencies = RequestLatencies(
                **{f.name: getattr(latencies, f.name)[order] for f in dataclasses.fields(latencies)}
            )
            sec, finish_ns = sec[order], finish_ns[order]
            percentiles = {q: v[order] for q, v in percentiles.items()}
            gap_start, num_gaps = gap_start[order], num_gaps[order]
            row_gap_sum_us = row_gap_sum_us[order]
            request_ids = [request_ids[i] for i in order.tolist()]
            vantage, status, final = vantage[order], status[order], final[order]
            labels = {k: LabelColumn(c.values, c.codes[order]) for k, c in labels.items()}
        now_s = int(np.floor(now))
        in_range = (sec > now_s - LATE_HORIZON_S) & (sec <= now_s + FUTURE_TOLERANCE_S)
        accepted = final & in_range
        ok = final & (status == Status.OK)
        err = final & (status == Status.ERROR)

        row_values = np.stack((latencies.ttft_s, latencies.tpot_s, latencies.e2el_s))
        row_index, row_prom = _sketch_and_prom(row_values)
        return cls(
            request_ids=request_ids,
            vantage=vantage,
            status=status,
            final=final,
            labels=labels,
            latencies=latencies,
            now_s=now_s,
            sec=sec,
            finish_s=finish_ns / _NS_PER_S,
            accepted=accepted,
            ok=ok,
            err=err,
            aborted=final & (status == Status.ABORTED),
            rejected=final & (status == Status.REJECTED),
            judged=ok | err,
            tokens=latencies.output_tokens,
            row_values=row_values,
            row_index=row_index,
            prom_index=row_prom,
            gap_codes=gap_codes(gaps_us),
            row_gap_sum_us=row_gap_sum_us,
            gap_start=gap_start,
            num_gaps=num_gaps,
            itl_percentiles=percentiles,
            num_late=int(np.count_nonzero(accepted & (sec <= now_s - RING_S))),
            num_dropped_late=int(np.count_nonzero(final & (sec <= now_s - LATE_HORIZON_S))),
            num_dropped_future=int(np.count_nonzero(final & (sec > now_s + FUTURE_TOLERANCE_S))),
        )

    def __len__(self) -> int:
        return int(self.sec.shape[0])

    def selection(self, spec: SLOSpec, vantage: int | None = None) -> B:
        """Rows of the spec's vantage (or of ``vantage``) whose labels match its selector
        (final or not)."""
        mask = self._mask("vantage", str(int(spec.vantage if vantage is None else vantage)))
        for key, value in spec.selector.items():
            mask = mask & self._mask(key, value)
        return mask

    def _mask(self, key: str, value: str) -> B:
        cached = self._masks.get((key, value))
        if cached is None:
            if key == "vantage":
                cached = self.vantage == int(value)
            else:
                column = self.labels.get(key)
                cached = (
                    np.zeros(len(self), dtype=np.bool_) if column is None else column.mask(value)
                )
            self._masks[(key, value)] = cached
        return cached

    def verdicts(self, objectives: Sequence[Objective]) -> Verdicts:
        """Every row judged against ``objectives`` (shared by SLOs with the same ones)."""
        key = tuple(objectives)
        cached = self._verdicts.get(key)
        if cached is None:
            rows = status_batch(self.status, self.final)
            cached = judge_values(rows, self.latencies, self.itl_percentiles, key)
            self._verdicts[key] = cached
        return cached
