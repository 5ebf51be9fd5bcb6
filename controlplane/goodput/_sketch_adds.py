"""What each SLO's selection of a batch's rows adds to its latency sketches and histograms,
for every SLO of the engine at once.

For each 10-s slot the selected rows finish in and each metric, the bucket counts come as
a *span* (lowest to highest non-empty bucket: what ``SketchRing.add`` takes), plus the
Prometheus bucket counts and value sums of the lifetime histograms. SLOs that select the
same rows (several SLOs on one model, a catch-all SLO in front of a one-model fleet) share
one result. All distinct selections are counted together, in a dense (selection and slot,
bucket) layout in which each metric takes only the buckets from its lowest to its highest
value: one ``bincount`` for the rows' metrics and one for the ITL gaps, counted by their
code (sketch and Prometheus bucket in one), so the Prometheus counts of the gaps follow
from the same count. The cost per SLO is a few list operations, not a few dozen numpy
calls, and no Python runs per row or gap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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

__all__ = ["NUM_PROM", "SketchAdds", "sketch_adds"]

I64 = npt.NDArray[np.int64]
#: Bucket indices and gap codes (int16 codes from the lookup table, else int64).
Ints = npt.NDArray[np.signedinteger[Any]]

#: Prometheus buckets of the lifetime histograms (the bounds, then ``+Inf``).
NUM_PROM = len(buckets.LATENCY_BUCKETS_S) + 1
_ROW_METRICS = (TTFT, TPOT, E2EL)  # rows 0, 1, 2 of BatchView.row_index
_LAYOUT_METRICS = (*_ROW_METRICS, ITL)  # the order of _Layout's values
# Counters laid out densely at once when counting spans (8 MiB of int64).
_DENSE_BUDGET = 1 << 20
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


def sketch_adds(view: BatchView, selections: Sequence[I64]) -> list[SketchAdds | None]:
    """What each selection of OK rows of ``view`` (ascending row numbers) adds, in order;
    ``None`` for an empty selection. Equal selections share one result."""
    distinct: dict[bytes, int] = {}
    chosen: list[I64] = []
    which: list[int] = []
    for rows in selections:
        if rows.shape[0] == 0:
            which.append(-1)
            continue
        d = distinct.setdefault(rows.tobytes(), len(chosen))
        if d == len(chosen):
            chosen.append(rows)
        which.append(d)
    computed = _compute(view, chosen) if chosen else []
    return [computed[d] if d >= 0 else None for d in which]


def _compute(view: BatchView, selections: list[I64]) -> list[SketchAdds]:
    num = len(selections)
    sizes = np.array([rows.shape[0] for rows in selections], dtype=np.int64)
    rows = np.concatenate(selections)
    owner = np.repeat(np.arange(num, dtype=np.int64), sizes)
    # A group is one selection's rows in one 10-s slot: contiguous, as each selection's rows
    # are ascending and so in finish order; groups are ordered by selection.
    slot10 = view.sec[rows] // 10
    first = np.ones(rows.shape[0], dtype=np.bool_)
    first[1:] = (slot10[1:] != slot10[:-1]) | (owner[1:] != owner[:-1])
    group = np.cumsum(first) - 1
    layout = _Layout(slot10[first].tolist(), owner[first], num)

    index = view.row_index[:, rows]
    defined = index >= 0
    layout.add_rows([index[r][defined[r]] for r in range(3)], [group[d] for d in defined])
    lengths = view.num_gaps[rows]
    if num == 1 and int(lengths.sum()) == view.gap_codes.shape[0]:
        # Every gap of the batch is selected (the common case): no gather. The gaps lie in
        # the batch's row order: visit the rows by where their gaps start.
        by_start = np.argsort(view.gap_start[rows], kind="stable")
        layout.add_gaps(view.gap_codes, group[by_start], lengths[by_start])
    else:
        codes = view.gap_codes[gap_positions(view.gap_start[rows], lengths)]
        layout.add_gaps(codes, group, lengths)
    spans, itl_histograms = layout.count()

    histograms = np.zeros((num, len(METRICS), NUM_PROM), dtype=np.int64)
    prom = view.prom_index[:, rows]
    keys = [(owner * 3 + r) * NUM_PROM + prom[r] for r in range(3)]
    by_row_metric = np.bincount(
        np.concatenate([k[d] for k, d in zip(keys, defined, strict=True)]),
        minlength=num * 3 * NUM_PROM,
    )
    histograms[:, list(_ROW_METRICS)] = by_row_metric.reshape(num, 3, NUM_PROM)
    histograms[:, ITL] = itl_histograms
    # Sums per selection: segments of the concatenated rows (NaN: undefined, adds nothing).
    starts = np.cumsum(sizes) - sizes
    row_sums = np.add.reduceat(np.nan_to_num(view.row_values[:, rows], nan=0.0), starts, axis=1)
    gap_sums = np.add.reduceat(view.row_gap_sum_us[rows], starts)
    return [
        SketchAdds(
            spans=spans[d],
            histogram_counts=histograms[d],
            histogram_sums=[
                float(row_sums[0, d]),
                float(row_sums[1, d]),
                int(gap_sums[d]) / _US_PER_S,
                float(row_sums[2, d]),
            ],
        )
        for d in range(num)
    ]


class _Layout:
    """Counts of values by (group, column): one column per bucket from each metric's lowest
    to its highest value, the ITL gaps by *code* (two columns per sketch bucket, see
    ``BatchView.gap_codes``), so that one count gives both their spans and, summed over a
    selection's groups, their Prometheus buckets. Groups are counted in chunks that keep
    the dense layout within ``_DENSE_BUDGET`` counters (a single chunk unless the records
    of a batch finish over a long stretch of time, such as a backlog)."""

    def __init__(self, group_slot: list[int], group_owner: I64, num: int) -> None:
        self.group_slot = group_slot
        self.group_owner = group_owner
        self.num = num
        self.values: list[Ints] = []
        self.groups: list[I64] = []
        self.gap_lengths: I64 = np.zeros(0, dtype=np.int64)

    def add_rows(self, values: list[Ints], groups: list[I64]) -> None:
        """Bucket indices of TTFT, TPOT and E2EL and the group of each."""
        self.values += values
        self.groups += groups

    def add_gaps(self, codes: Ints, groups: I64, lengths: I64) -> None:
        """The gaps' codes, ``lengths[j]`` consecutive ones in group ``groups[j]``."""
        self.values.append(codes)
        self.groups.append(groups)
        self.gap_lengths = lengths

    def count(self) -> tuple[list[list[tuple[int, int, int, I64]]], I64]:
        """The spans of each selection, and its ITL Prometheus bucket counts."""
        values, groups = self.values, self.groups
        lows = [int(v.min()) if v.shape[0] else 0 for v in values]
        lows[3] -= lows[3] % 2  # whole sketch buckets of codes: an even first column
        widths = [
            int(v.max()) - lo + 1 if v.shape[0] else 0 for v, lo in zip(values, lows, strict=True)
        ]
        widths[3] += widths[3] % 2
        columns = np.cumsum([0, *widths]).tolist()
        width = max(columns[-1], 1)
        # Rows (few) and gaps (many) are keyed apart: the gaps' keys are never copied.
        row_keys = np.concatenate(
            [
                g * width + (columns[m] - lows[m]) + v
                for m, (v, g) in enumerate(zip(values[:3], groups[:3], strict=True))
            ]
        )
        # Each run of gaps' key base, repeated over its gaps, plus their codes: one array
        # the size of the gaps (not a group per gap, then its keys).
        gap_keys = np.repeat(groups[3] * width + (columns[3] - lows[3]), self.gap_lengths)
        gap_keys += values[3]
        num_groups = len(self.group_slot)
        per_chunk = max(1, _DENSE_BUDGET // width)
        spans: list[list[tuple[int, int, int, I64]]] = [[] for _ in range(self.num)]
        by_code = np.zeros((self.num, widths[3]), dtype=np.int64)
        for first in range(0, num_groups, per_chunk):
            end = min(num_groups, first + per_chunk)
            size = (end - first) * width
            dense = np.zeros(size, dtype=np.int64)
            for keys in (row_keys, gap_keys):
                part = keys
                if per_chunk < num_groups:
                    part = keys[(keys >= first * width) & (keys < end * width)] - first * width
                dense += np.bincount(part, minlength=size)
            dense = dense.reshape(end - first, width)
            owners = self.group_owner[first:end]
            for m, metric in enumerate(_LAYOUT_METRICS):
                block = dense[:, columns[m] : columns[m + 1]]
                lo = lows[m]
                if metric == ITL and widths[m]:
                    # Each selection's code counts, its groups summed (they are contiguous).
                    cut = np.flatnonzero(np.concatenate(([True], owners[1:] != owners[:-1])))
                    by_code[owners[cut]] += np.add.reduceat(block, cut, axis=0)
                    block = block.reshape(end - first, widths[m] // 2, 2).sum(axis=2)
                    lo //= 2
                self._spans(spans, block, first, metric, lo)
        return spans, self._prometheus(by_code, lows[3])

    def _spans(
        self,
        out: list[list[tuple[int, int, int, I64]]],
        block: I64,
        first: int,
        metric: int,
        lo: int,
    ) -> None:
        """Append each group's span of ``block`` (counts of ``metric`` from bucket ``lo``)."""
        if not block.shape[1]:
            return
        nonzero = block > 0
        low = nonzero.argmax(axis=1)
        high = block.shape[1] - nonzero[:, ::-1].argmax(axis=1)
        owners = self.group_owner
        for g in np.flatnonzero(nonzero.any(axis=1)).tolist():
            a, b = int(low[g]), int(high[g])
            group = first + g
            out[int(owners[group])].append((self.group_slot[group], metric, lo + a, block[g, a:b]))

    def _prometheus(self, by_code: I64, lo: int) -> I64:
        """``(num, NUM_PROM)`` Prometheus bucket counts from counts by code from ``lo``."""
        out = np.zeros((self.num, NUM_PROM), dtype=np.int64)
        if by_code.shape[1]:
            prom = PROM_OF_CODE[lo : lo + by_code.shape[1]]
            order = np.argsort(prom, kind="stable")
            cut = np.flatnonzero(np.concatenate(([True], np.diff(prom[order]) != 0)))
            out[:, prom[order][cut]] = np.add.reduceat(by_code[:, order], cut, axis=1)
        return out
