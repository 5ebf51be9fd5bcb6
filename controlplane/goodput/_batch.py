"""One ingested batch, prepared once for every SLO: sorted by finish time, with latencies,
bucket indices and verdicts shared between the SLOs that need them.

Per batch the metric core runs once (latencies, ITL gaps, one sort for ITL percentiles);
per SLO the engine only masks rows and counts them. Rows are reordered by finish second so
that each SLO's rows come grouped by slot and sums per slot are one ``reduceat``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controlplane.goodput._judge import judge_values
from controlplane.goodput.spec import SLOSpec
from exporters import buckets
from exporters.latency import ItlGroups, RequestLatencies, itl_gaps_s, request_latencies
from exporters.records import RecordBatch, Status
from exporters.sketch import LatencySketch
from exporters.slo import Objective, Verdicts

__all__ = [
    "FUTURE_TOLERANCE_S",
    "LATE_HORIZON_S",
    "METRICS",
    "RING_S",
    "BatchView",
    "gap_positions",
    "prom_index",
]

B = npt.NDArray[np.bool_]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

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
    out: I64 = _PROM_OF_SKETCH[sketch_index]
    split = _STRADDLES[sketch_index]
    if split.any():
        out[split] = buckets.bucket_index(values[split])
    return out


def _sketch_and_prom(values: F64) -> tuple[I64, I64]:
    """Sketch and Prometheus bucket per value, ``-1`` where the value is undefined (NaN)."""
    sketch = np.full(values.shape[0], -1, dtype=np.int64)
    prom = np.full(values.shape[0], -1, dtype=np.int64)
    defined = ~np.isnan(values)
    if defined.any():
        sketch[defined] = LatencySketch.bucket_index(values[defined])
        prom[defined] = prom_index(values[defined], sketch[defined])
    return sketch, prom


@dataclass(slots=True)
class BatchView:
    """A batch sorted by finish second, with everything the SLOs share.

    ``sec``: finish second (arrival + E2EL; arrival when E2EL is undefined), ascending.
    ``accepted``: final rows whose finish lies within the late horizon and the future
    tolerance of ``now_s``. Status masks (``ok`` …) cover final rows only.
    ``row_index`` / ``prom_index``: (3, n) sketch / Prometheus bucket of TTFT, TPOT, E2EL
    (``-1`` where undefined); ``gap_*``: bucket indices of the ITL gaps of FULL rows, row
    after row (row *i* owns ``num_gaps[i]`` from ``gap_start[i]``); ``row_gap_sum_s``: the
    sum of each row's gaps.
    """

    batch: RecordBatch
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
    gap_index: I64
    gap_prom_index: I64
    row_gap_sum_s: F64
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
        latencies = request_latencies(batch, validate=validate)
        finish_ns = (
            batch.arrival_time_ns
            + np.where(np.isnan(latencies.e2el_s), 0, np.rint(latencies.e2el_s * 1e6)).astype(
                np.int64
            )
            * 1000
        )
        sec = finish_ns // _NS_PER_S
        if sec.shape[0] > 1 and (sec[1:] < sec[:-1]).any():
            order = np.argsort(sec, kind="stable")
            batch = batch.take(order)
            latencies = RequestLatencies(
                **{f.name: getattr(latencies, f.name)[order] for f in dataclasses.fields(latencies)}
            )
            sec, finish_ns = sec[order], finish_ns[order]
        now_s = int(np.floor(now))
        final = batch.final
        in_range = (sec > now_s - LATE_HORIZON_S) & (sec <= now_s + FUTURE_TOLERANCE_S)
        accepted = final & in_range
        status = batch.status
        ok = final & (status == Status.OK)
        err = final & (status == Status.ERROR)

        row_values = np.stack((latencies.ttft_s, latencies.tpot_s, latencies.e2el_s))
        indices = [_sketch_and_prom(v) for v in row_values]
        gap_s, gap_rows = itl_gaps_s(batch, validate=False)
        gap_index = LatencySketch.bucket_index(gap_s)
        num_gaps = latencies.num_gaps
        wanted = sorted(set(itl_percentiles))
        percentiles: dict[float, F64] = {}
        if wanted and gap_s.shape[0]:
            groups = ItlGroups.of(batch)
            percentiles = {q: groups.percentile(q) for q in wanted}
        elif wanted:
            percentiles = {q: np.full(len(batch), np.nan) for q in wanted}
        return cls(
            batch=batch,
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
            row_index=np.stack([sketch for sketch, _ in indices]),
            prom_index=np.stack([prom for _, prom in indices]),
            gap_index=gap_index,
            gap_prom_index=prom_index(gap_s, gap_index),
            row_gap_sum_s=np.bincount(gap_rows, weights=gap_s, minlength=len(batch)).astype(
                np.float64
            ),
            gap_start=np.cumsum(num_gaps) - num_gaps,
            num_gaps=num_gaps,
            itl_percentiles=percentiles,
            num_late=int(np.count_nonzero(accepted & (sec <= now_s - RING_S))),
            num_dropped_late=int(np.count_nonzero(final & (sec <= now_s - LATE_HORIZON_S))),
            num_dropped_future=int(np.count_nonzero(final & (sec > now_s + FUTURE_TOLERANCE_S))),
        )

    def __len__(self) -> int:
        return int(self.sec.shape[0])

    def selection(self, spec: SLOSpec) -> B:
        """Rows of the spec's vantage whose labels match its selector (final or not)."""
        mask = self._mask("vantage", str(int(spec.vantage)))
        for key, value in spec.selector.items():
            mask = mask & self._mask(key, value)
        return mask

    def _mask(self, key: str, value: str) -> B:
        cached = self._masks.get((key, value))
        if cached is None:
            if key == "vantage":
                cached = self.batch.vantage == int(value)
            else:
                column = self.batch.labels.get(key)
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
            cached = judge_values(self.batch, self.latencies, self.itl_percentiles, key)
            self._verdicts[key] = cached
        return cached
