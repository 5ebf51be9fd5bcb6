"""What a selection of a batch's rows adds to an SLO's latency sketches and histograms.

SLOs that select the same rows (several SLOs on one model, a catch-all SLO in front of a
one-model fleet) share this work: it is computed once per batch and distinct selection and
cached on the :class:`~controlplane.goodput._batch.BatchView`. For each 10-s slot the rows
finish in and each metric it gives the bucket counts as a *span* (lowest to highest
non-empty bucket: what ``SketchRing.add`` takes), plus the Prometheus bucket counts and
value sums of the lifetime histograms. The counting is one ``bincount`` over
(metric, slot run, bucket) keys for the per-request metrics and one over (slot run,
bucket) for the ITL gaps: no Python per row or gap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controlplane.goodput._batch import (
    E2EL,
    ITL,
    METRICS,
    PROM_OF_CODE,
    TPOT,
    TTFT,
    BatchView,
    gap_positions,
)
from exporters import buckets
from exporters.sketch import LatencySketch

__all__ = ["NUM_PROM", "SketchAdds", "sketch_adds"]

I64 = npt.NDArray[np.int64]

#: Prometheus buckets of the lifetime histograms (the bounds, then ``+Inf``).
NUM_PROM = len(buckets.LATENCY_BUCKETS_S) + 1
_NB = LatencySketch.NUM_BUCKETS
_ROW_METRICS = np.array([TTFT, TPOT, E2EL], dtype=np.int64)
_US_PER_S = 1e6


@dataclass(frozen=True, slots=True)
class SketchAdds:
    """Sketch spans and histogram increments of one selection of OK rows.

    ``spans``: ``(slot10, metric, lo, counts)``: add ``counts`` to buckets ``lo …`` of
    ``metric`` in the 10-s slot ``slot10`` (shared arrays: read, never modified).
    ``histogram_counts``: ``(len(METRICS), NUM_PROM)`` Prometheus bucket counts;
    ``histogram_sums``: the sum of the values per metric, seconds.
    """

    spans: list[tuple[int, int, int, I64]]
    histogram_counts: I64
    histogram_sums: list[float]


def sketch_adds(view: BatchView, ok_rows: I64) -> SketchAdds:
    """What rows ``ok_rows`` of ``view`` (ascending, status OK) add; cached on the view."""
    key = ok_rows.tobytes()
    cached = view.sketch_adds_cache.get(key)
    if cached is None:
        cached = _compute(view, ok_rows)
        view.sketch_adds_cache[key] = cached
    return cached


def _compute(view: BatchView, ok_rows: I64) -> SketchAdds:
    # Rows come sorted by finish second: runs of one 10-s slot are contiguous.
    slot10 = view.sec[ok_rows] // 10
    first = np.concatenate(([True], slot10[1:] != slot10[:-1]))
    run = np.cumsum(first) - 1
    slots = slot10[first].tolist()
    runs = len(slots)
    counts = np.zeros((len(METRICS), runs, _NB), dtype=np.int64)
    histogram = np.zeros((len(METRICS), NUM_PROM), dtype=np.int64)

    index = view.row_index[:, ok_rows]
    defined = index >= 0
    keys = ((_ROW_METRICS[:, None] * runs + run) * _NB + index)[defined]
    counts += np.bincount(keys, minlength=len(METRICS) * runs * _NB).reshape(counts.shape)
    prom = (np.arange(3)[:, None] * NUM_PROM + view.prom_index[:, ok_rows])[defined]
    histogram[_ROW_METRICS] = np.bincount(prom, minlength=3 * NUM_PROM).reshape(3, NUM_PROM)
    sums = np.nansum(view.row_values[:, ok_rows], axis=1).tolist()

    lengths = view.num_gaps[ok_rows]
    with_gaps = lengths > 0
    total = int(lengths.sum())
    if total:
        # Gaps lie in the batch's row order: visit the rows by where their gaps start.
        starts = view.gap_start[ok_rows][with_gaps]
        by_start = np.argsort(starts, kind="stable")
        lengths, starts = lengths[with_gaps][by_start], starts[by_start]
        gap_run = np.repeat(run[with_gaps][by_start], lengths)
        if total == view.gap_codes.shape[0]:
            codes = view.gap_codes  # every gap of the batch is selected (the common case)
        else:
            codes = view.gap_codes[gap_positions(starts, lengths)]
        # One count of (run, code) gives the sketch (codes 2b, 2b + 1 are bucket b) and the
        # Prometheus buckets (PROM_OF_CODE) of the gaps.
        by_code = np.bincount(gap_run * (2 * _NB) + codes, minlength=runs * 2 * _NB)
        counts[ITL] = by_code.reshape(runs, _NB, 2).sum(axis=2)
        code_totals = by_code.reshape(runs, 2 * _NB).sum(axis=0)
        # Float weights are exact below 2**53 counts.
        by_prom = np.bincount(PROM_OF_CODE, weights=code_totals, minlength=NUM_PROM)
        histogram[ITL] = by_prom.astype(np.int64)
    gap_sum_s = int(view.row_gap_sum_us[ok_rows].sum()) / _US_PER_S

    nonzero = counts > 0
    lo = nonzero.argmax(axis=2)
    hi = _NB - nonzero[:, :, ::-1].argmax(axis=2)
    metrics, runs_with = (a.tolist() for a in np.nonzero(nonzero.any(axis=2)))
    spans = [
        (slots[r], m, int(lo[m, r]), counts[m, r, lo[m, r] : hi[m, r]])
        for m, r in zip(metrics, runs_with, strict=True)
    ]
    return SketchAdds(
        spans=spans,
        histogram_counts=histogram,
        histogram_sums=[sums[0], sums[1], gap_sum_s, sums[2]],
    )
