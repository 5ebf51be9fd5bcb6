"""Ring buffers of time slots: integer counters, and latency sketches stored as spans.

A slot is ``floor(time / resolution_s)``; a ring of ``size`` positions holds slot ``k`` at
position ``k % size`` and remembers which slot each position holds, so a stale position
(a slot that fell out of the ring) is recognised and reset when reused, and never read.
Callers decide which slots are in range; the rings only store and sum.

Sketch slots are stored per metric as a *span*: the counts from the lowest to the highest
non-empty bucket of :class:`~exporters.sketch.LatencySketch`'s layout. Latencies of one
metric over one slot cluster in a few hundred of its 1268 buckets, so a span costs a
fraction of a dense array, while summing spans is one slice-add each.
"""

from __future__ import annotations

import sys

import numpy as np
import numpy.typing as npt

from exporters.sketch import LatencySketch

__all__ = ["EMPTY_SLOT", "CounterRing", "SketchRing"]

I64 = npt.NDArray[np.int64]

#: Marks a ring position that holds no slot (no real time maps to it).
EMPTY_SLOT = np.iinfo(np.int64).min
NUM_BUCKETS = LatencySketch.NUM_BUCKETS


class CounterRing:
    """``width`` int64 counters per slot of ``resolution_s`` seconds, ``size`` slots kept."""

    __slots__ = ("resolution_s", "rows", "size", "slots")

    def __init__(self, resolution_s: int, size: int, width: int) -> None:
        self.resolution_s: int = resolution_s
        self.size: int = size
        self.rows: I64 = np.zeros((size, width), dtype=np.int64)
        self.slots: I64 = np.full(size, EMPTY_SLOT, dtype=np.int64)

    def add(self, slots: I64, sums: I64) -> None:
        """Add ``sums[j]`` to slot ``slots[j]``; ``slots`` are distinct and within the ring."""
        pos = slots % self.size
        stale = self.slots[pos] != slots
        if stale.any():
            reused = pos[stale]
            self.rows[reused] = 0
            self.slots[reused] = slots[stale]
        self.rows[pos] += sums

    def add_one(self, slot: int, row: I64) -> None:
        """Add ``row`` to slot ``slot`` (within the ring): :meth:`add` for one slot."""
        pos = slot % self.size
        if int(self.slots[pos]) != slot:
            self.rows[pos] = 0
            self.slots[pos] = slot
        self.rows[pos] += row

    def total(self, first: int, last: int) -> I64:
        """The column sums over slots ``first … last`` (inclusive) that the ring holds."""
        held = (self.slots >= first) & (self.slots <= last)
        total: I64 = self.rows[held].sum(axis=0)
        return total

    def column(self, first: int, last: int, column: int) -> I64:
        """Counter ``column`` of each slot ``first … last`` (inclusive); 0 where not held."""
        slots = np.arange(first, last + 1, dtype=np.int64)
        pos = slots % self.size
        values: I64 = np.where(self.slots[pos] == slots, self.rows[pos, column], 0)
        return values

    def get(self, slot: int) -> I64 | None:
        """The counters of ``slot`` (a copy), or ``None`` when the ring does not hold it."""
        pos = slot % self.size
        if int(self.slots[pos]) != slot:
            return None
        row: I64 = self.rows[pos].copy()
        return row

    def held_slots(self) -> I64:
        """The slots the ring holds, ascending."""
        held: I64 = np.sort(self.slots[self.slots != EMPTY_SLOT])
        return held

    def remapped(self, columns: list[int | None]) -> CounterRing:
        """A copy whose column ``j`` is this ring's column ``columns[j]`` (``None``: zeros)."""
        ring = CounterRing(self.resolution_s, self.size, len(columns))
        ring.slots = self.slots.copy()
        for j, source in enumerate(columns):
            if source is not None:
                ring.rows[:, j] = self.rows[:, source]
        return ring

    def resized(self, size: int) -> CounterRing:
        """A ring of ``size`` positions holding the newest ``size`` slots of this one."""
        ring = CounterRing(self.resolution_s, size, self.rows.shape[1])
        held = self.held_slots()[-size:]
        if held.shape[0]:
            ring.add(held, self.rows[held % self.size])
        return ring

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes + self.slots.nbytes)


class SketchRing:
    """Latency sketches of ``num_metrics`` metrics per slot of ``resolution_s`` seconds."""

    __slots__ = ("_lo", "_spans", "num_metrics", "resolution_s", "size", "slots")

    def __init__(self, resolution_s: int, size: int, num_metrics: int) -> None:
        self.resolution_s: int = resolution_s
        self.size: int = size
        self.num_metrics: int = num_metrics
        self.slots: I64 = np.full(size, EMPTY_SLOT, dtype=np.int64)
        self._lo: I64 = np.zeros((size, num_metrics), dtype=np.int64)
        self._spans: list[list[I64 | None]] = [[None] * num_metrics for _ in range(size)]

    def add(self, slot: int, metric: int, lo: int, counts: I64) -> None:
        """Add bucket counts ``counts`` (bucket ``lo`` onwards) to ``metric`` of ``slot``."""
        pos = slot % self.size
        if int(self.slots[pos]) != slot:
            self.slots[pos] = slot
            self._spans[pos] = [None] * self.num_metrics
        spans = self._spans[pos]
        current = spans[metric]
        hi = lo + counts.shape[0]
        if current is None:
            spans[metric] = counts.astype(np.int64, copy=True)
            self._lo[pos, metric] = lo
            return
        current_lo = int(self._lo[pos, metric])
        current_hi = current_lo + current.shape[0]
        if lo >= current_lo and hi <= current_hi:
            current[lo - current_lo : hi - current_lo] += counts
            return
        # Widen the span to cover both ranges (rare once a slot has seen its first values).
        new_lo, new_hi = min(lo, current_lo), max(hi, current_hi)
        merged = np.zeros(new_hi - new_lo, dtype=np.int64)
        merged[current_lo - new_lo : current_hi - new_lo] = current
        merged[lo - new_lo : hi - new_lo] += counts
        spans[metric] = merged
        self._lo[pos, metric] = new_lo

    def add_dense(self, slot: int, counts: I64) -> None:
        """Add full ``(num_metrics, NUM_BUCKETS)`` counts (for example a decoded rollup)."""
        for metric in range(self.num_metrics):
            nonzero = np.flatnonzero(counts[metric])
            if nonzero.shape[0]:
                lo, hi = int(nonzero[0]), int(nonzero[-1]) + 1
                self.add(slot, metric, lo, counts[metric, lo:hi])

    def total(self, first: int, last: int) -> I64:
        """Dense ``(num_metrics, NUM_BUCKETS)`` sums over slots ``first … last`` held."""
        out: I64 = np.zeros((self.num_metrics, NUM_BUCKETS), dtype=np.int64)
        held = np.flatnonzero((self.slots >= first) & (self.slots <= last))
        for pos in held.tolist():
            self._add_into(out, pos)
        return out

    def get(self, slot: int) -> I64 | None:
        """Dense counts of ``slot``, or ``None`` when the ring does not hold it."""
        pos = slot % self.size
        if int(self.slots[pos]) != slot:
            return None
        out: I64 = np.zeros((self.num_metrics, NUM_BUCKETS), dtype=np.int64)
        self._add_into(out, pos)
        return out

    def resized(self, size: int) -> SketchRing:
        """A ring of ``size`` positions holding the newest ``size`` slots of this one."""
        ring = SketchRing(self.resolution_s, size, self.num_metrics)
        held = np.sort(self.slots[self.slots != EMPTY_SLOT])[-size:]
        for slot in held.tolist():
            pos = slot % self.size
            for metric, span in enumerate(self._spans[pos]):
                if span is not None:
                    ring.add(slot, metric, int(self._lo[pos, metric]), span)
        return ring

    def _add_into(self, out: I64, pos: int) -> None:
        lo_row = self._lo[pos].tolist()
        for metric, span in enumerate(self._spans[pos]):
            if span is not None:
                lo = lo_row[metric]
                out[metric, lo : lo + span.shape[0]] += span

    @property
    def nbytes(self) -> int:
        """Bytes held, Python object headers of the spans and their lists included."""
        spans = sum(sys.getsizeof(s) for row in self._spans for s in row if s is not None)
        lists = sum(sys.getsizeof(row) for row in self._spans) + sys.getsizeof(self._spans)
        return int(spans + lists + self.slots.nbytes + self._lo.nbytes)
