"""The live state of one SLO: tiered counter and sketch rings, lifetime totals, in-flight ids.

Tiers (slot resolution, slots kept behind the clock's slot, slots accepted ahead of it):

=========  ==========  ======================================  ========================
ring       resolution  kept                                    answers
=========  ==========  ======================================  ========================
counters   1 s         3600 (1 h)                              windows <= 1 h
counters   1 min       1442 (1 d + 2 min)                      windows <= 1 d, rollups
counters   1 h         max(compliance, 1 d) + 1 h              longer windows
sketches   10 s        32 (5 min + 20 s)                       windows <= 5 min
sketches   1 min       122 (the 2-h late horizon + 2 min)      windows <= 1 h, rollups
sketches   1 h         26 (1 d + 2 h)                          windows <= 1 d
sketches   1 d         ceil(compliance / 1 d) + 2              longer windows
=========  ==========  ======================================  ========================

The sketch tiers are kept twice: for the requests the SLO judges, and for the OK requests
its selector matches at the other vantage (percentiles per vantage; not judged). Rejections
per priority class have counter tiers of their own, with the counters' ranges, made on the
SLO's first rejection (:class:`RejectedByClass`). A minute's rollup carries both (its
classes' counts, the other vantage's sketches) when the SLO has them, and a loaded rollup
restores them, so they survive a restart like the rest.

Every accepted record is counted into every ring whose range holds its finish slot; each
window then reads one ring. Counter windows are the ``ceil(W / r)`` slots ending with the
current one; sketch windows cover ``[now − W, now]`` rounded outward to whole slots, so a
percentile never rests on a nearly empty current slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from controlplane.goodput import _summarize as col
from controlplane.goodput._batch import METRICS, BatchView
from controlplane.goodput._blob import decode_sketch_blob, encode_sketch_blob
from controlplane.goodput._rings import NUM_BUCKETS, CounterRing, SketchRing
from controlplane.goodput._sketch_adds import NUM_PROM, SketchAdds
from controlplane.goodput.spec import SLOSpec
from controlplane.goodput.stats import LatencyHistogram, MinuteRollup, SLOTotals

__all__ = ["MAX_CLASSES", "OTHER_CLASS", "BatchCounts", "SLOState"]

B = npt.NDArray[np.bool_]
I64 = npt.NDArray[np.int64]

R = TypeVar("R", CounterRing, SketchRing)

_DAY_S, _HOUR_S = 86400, 3600
#: Priority classes whose rejections an SLO counts apart; the rejections of any further
#: class are counted together under :data:`OTHER_CLASS`.
MAX_CLASSES = 8
OTHER_CLASS = "other"


def _hours_kept(window_s: float) -> int:
    return math.ceil(max(window_s, _DAY_S) / _HOUR_S) + 1


def _days_kept(window_s: float) -> int:
    return math.ceil(window_s / _DAY_S) + 2


class _Tier(Generic[R]):
    """A ring with the range of slots it accepts: ``(now_slot − kept, now_slot + ahead]``."""

    __slots__ = ("ahead", "kept", "ring")

    def __init__(self, ring: R, kept: int, ahead: int) -> None:
        self.ring: R = ring
        self.kept = kept
        self.ahead = ahead

    def resize(self, kept: int) -> None:
        self.kept = kept
        self.ring = self.ring.resized(kept + self.ahead)

    def holds_slot(self, slot: int, now_s: int) -> bool:
        now_slot = now_s // self.ring.resolution_s
        return now_slot - self.kept < slot <= now_slot + self.ahead

    def holds(self, slots: I64, now_s: int) -> B:
        now_slot = now_s // self.ring.resolution_s
        held: B = (slots > now_slot - self.kept) & (slots <= now_slot + self.ahead)
        return held


def _counter_tier(resolution_s: int, kept: int, ahead: int, width: int) -> _Tier[CounterRing]:
    return _Tier(CounterRing(resolution_s, kept + ahead, width), kept, ahead)


def _sketch_tier(resolution_s: int, kept: int, ahead: int) -> _Tier[SketchRing]:
    return _Tier(SketchRing(resolution_s, kept + ahead, len(METRICS)), kept, ahead)


def _counter_tiers(window_s: float, width: int) -> list[_Tier[CounterRing]]:
    """The counter tiers: 1 s over 1 h, 1 min over 1 d, 1 h over the compliance window."""
    return [
        _counter_tier(1, 3600, 60, width),
        _counter_tier(60, 1442, 2, width),
        _counter_tier(_HOUR_S, _hours_kept(window_s), 2, width),
    ]


def _sketch_tiers(window_s: float) -> list[_Tier[SketchRing]]:
    return [
        _sketch_tier(10, 32, 7),
        _sketch_tier(60, 122, 2),
        _sketch_tier(_HOUR_S, 26, 2),
        _sketch_tier(_DAY_S, _days_kept(window_s), 2),
    ]


def _add_to_tiers(tiers: list[_Tier[CounterRing]], seconds: I64, sums: I64, now_s: int) -> None:
    """Add per-second counter rows (``seconds`` ascending, distinct) to every tier."""
    if seconds.shape[0] == 1:  # one finish second (a short batch, a few rejections): no grouping
        second = int(seconds[0])
        for tier in tiers:
            slot = second // tier.ring.resolution_s
            if tier.holds_slot(slot, now_s):
                tier.ring.add_one(slot, sums[0])
        return
    for tier in tiers:
        slots = seconds // tier.ring.resolution_s
        firsts = np.flatnonzero(np.concatenate(([True], slots[1:] != slots[:-1])))
        slots, per_slot = slots[firsts], np.add.reduceat(sums, firsts, axis=0)
        held = tier.holds(slots, now_s)
        tier.ring.add(slots[held], per_slot[held])


def _counter_window(tiers: list[_Tier[CounterRing]], window_s: float, now: float) -> I64:
    """Counter sums over the ``ceil(W / r)`` slots ending with the current one, from the
    finest tier that spans ``W``."""
    tier = next((t for t in tiers if window_s <= t.kept * t.ring.resolution_s), tiers[-1])
    r = tier.ring.resolution_s
    last = math.floor(now) // r
    return tier.ring.total(last - math.ceil(window_s / r) + 1, last)


def _sketch_window(tiers: list[_Tier[SketchRing]], window_s: float, now: float) -> I64:
    """Sketch sums over the slots that cover ``[now − W, now]``."""
    limits = (300, _HOUR_S, _DAY_S)
    tier = next(
        (t for t, limit in zip(tiers, limits, strict=False) if window_s <= limit), tiers[-1]
    )
    r = tier.ring.resolution_s
    return tier.ring.total(math.floor(now - window_s) // r, math.floor(now) // r)


def _add_spans(tiers: list[_Tier[SketchRing]], adds: SketchAdds, now_s: int) -> None:
    for slot10, metric, lo, counts in adds.spans:
        second = slot10 * 10
        for tier in tiers:
            slot = second // tier.ring.resolution_s
            if tier.holds_slot(slot, now_s):
                tier.ring.add(slot, metric, lo, counts)


@dataclass(frozen=True, slots=True)
class ClassRejections:
    """One batch's rejections of one SLO by priority class: ``names[c]`` is column ``c``
    of ``sums``, one row per finish second ``seconds[j]`` (ascending)."""

    names: list[str]
    seconds: I64
    sums: I64


class RejectedByClass:
    """Rejections of one SLO per priority class (the ``priority`` label; ``""`` when a
    request carries none), in counter tiers of their own with the main counters' ranges
    and resolutions, so a window sums the same slots as the SLO's ``rejected`` count.
    One column per class seen, at most :data:`MAX_CLASSES`; later classes share the
    column :data:`OTHER_CLASS`. Made on an SLO's first rejection: an SLO that sheds
    nothing holds none of it."""

    def __init__(self, window_s: float) -> None:
        self.names: list[str] = []
        self.tiers = _counter_tiers(window_s, 0)

    def add(self, batch: ClassRejections, now_s: int) -> None:
        columns = [self._column(name) for name in batch.names]
        sums = batch.sums
        if columns != list(range(len(self.names))):
            sums = np.zeros((batch.sums.shape[0], len(self.names)), dtype=np.int64)
            for j, column in enumerate(columns):  # a few classes
                sums[:, column] += batch.sums[:, j]
        _add_to_tiers(self.tiers, batch.seconds, sums, now_s)

    def _column(self, name: str) -> int:
        if name in self.names:
            return self.names.index(name)
        if len(self.names) >= MAX_CLASSES:
            name = OTHER_CLASS
            if name in self.names:
                return self.names.index(name)
        self.names.append(name)
        width = len(self.names)
        for tier in self.tiers:
            tier.ring = tier.ring.remapped([*range(width - 1), None])
        return width - 1

    def minute(self, minute: int) -> dict[str, int]:
        """Rejections per class in one minute (the classes with any; empty when the minute
        tier does not hold it)."""
        row = self.tiers[1].ring.get(minute)
        if row is None:
            return {}
        return {name: int(v) for name, v in zip(self.names, row.tolist(), strict=True) if v}

    def window(self, window_s: float, now: float) -> dict[str, int]:
        """Rejections per class over the window (the classes seen, zeros included)."""
        if not self.names:
            return {}
        total = _counter_window(self.tiers, window_s, now)
        return dict(zip(self.names, (int(v) for v in total.tolist()), strict=True))

    def resize(self, window_s: float) -> None:
        self.tiers[2].resize(_hours_kept(window_s))

    @property
    def nbytes(self) -> int:
        return sum(t.ring.nbytes for t in self.tiers)


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """What one batch adds to one SLO's counters: ``selected`` rows (final or not, for the
    in-flight gauge), per finish second ``seconds[j]`` the counter row ``sums[j]``, the
    accepted OK rows whose latencies go to the sketches, and the rejections by priority
    class (``None``: none)."""

    selected: B
    seconds: I64
    sums: I64
    ok_rows: I64
    rejected: ClassRejections | None = None


class SLOState:
    """Everything the engine keeps for one SLO (see the module docstring for the tiers).

    Ingesting is two steps, so that the engine computes everything before it changes
    anything: :meth:`count` (pure) and :meth:`apply`."""

    def __init__(self, spec: SLOSpec) -> None:
        self.spec = spec
        self.keys: tuple[str, ...] = spec.objective_keys
        width = col.width(len(self.keys))
        self.counters = _counter_tiers(spec.window_s, width)
        self.sketches = _sketch_tiers(spec.window_s)
        # Latencies of the OK requests the selector matches at the other vantage (not
        # judged; in the rollups): percentiles per vantage beside the SLO's own. Made on the
        # first such request: an SLO whose traffic is seen at one vantage holds none.
        self.other_sketches: list[_Tier[SketchRing]] | None = None
        self.rejected_by_class: RejectedByClass | None = None
        # Lifetime totals for Prometheus counters and histograms (never decrease).
        self.totals: dict[str, int] = dict.fromkeys(("good", "bad", "rejected", "aborted"), 0)
        self.violation_totals: dict[str, int] = dict.fromkeys(self.keys, 0)
        self.measured_totals: dict[str, int] = dict.fromkeys(self.keys, 0)
        self.histogram_counts: I64 = np.zeros((len(METRICS), NUM_PROM), dtype=np.int64)
        self.histogram_sums = [0.0] * len(METRICS)
        self.dirty_minutes: set[int] = set()
        self.in_flight: dict[str, float] = {}
        self._in_flight_pruned_s = -math.inf
        self.rollups_without_sketches = 0

    # -- spec changes -------------------------------------------------------------------

    def update_spec(self, spec: SLOSpec) -> None:
        """Apply a new version of this SLO, keeping history (verdicts stay as judged)."""
        keys = spec.objective_keys
        if keys != self.keys:
            columns = col.remap_columns(self.keys, keys)
            for tier in self.counters:
                tier.ring = tier.ring.remapped(columns)
            for key in keys:
                self.violation_totals.setdefault(key, 0)
                self.measured_totals.setdefault(key, 0)
            self.keys = keys
        if spec.vantage != self.spec.vantage:
            # The other vantage's latencies become the SLO's own, and the other way round.
            other = self.other_sketches or _sketch_tiers(spec.window_s)
            self.sketches, self.other_sketches = other, self.sketches
        if spec.window_s != self.spec.window_s:
            self.counters[2].resize(_hours_kept(spec.window_s))
            self.sketches[3].resize(_days_kept(spec.window_s))
            if self.other_sketches is not None:
                self.other_sketches[3].resize(_days_kept(spec.window_s))
            if self.rejected_by_class is not None:
                self.rejected_by_class.resize(spec.window_s)
        self.spec = spec

    # -- ingest -------------------------------------------------------------------------

    def count(self, view: BatchView) -> BatchCounts:
        """What the batch's rows that this SLO selects add to its counters (vectorised;
        changes nothing: :meth:`apply` does)."""
        selected = view.selection(self.spec)
        rows = np.flatnonzero(selected & view.accepted)
        if rows.shape[0] == 0:
            empty = np.zeros(0, dtype=np.int64)
            return BatchCounts(selected, empty, np.zeros((0, 0), dtype=np.int64), empty)
        verdicts = view.verdicts(self.spec.objectives)
        judged, good = view.judged[rows], verdicts.good[rows]
        aborted = view.aborted[rows]
        tokens = view.tokens[rows]
        k = len(self.keys)
        contrib = np.empty((rows.shape[0], col.width(k)), dtype=np.int64)
        contrib[:, col.REQUESTS] = judged
        contrib[:, col.GOOD] = good
        contrib[:, col.ERRORS] = view.err[rows]
        contrib[:, col.ABORTED] = aborted
        contrib[:, col.REJECTED] = view.rejected[rows]
        contrib[:, col.OUTPUT_TOKENS] = np.where(judged | aborted, tokens, 0)
        contrib[:, col.GOOD_OUTPUT_TOKENS] = np.where(good, tokens, 0)
        contrib[:, col.BASE_COLUMNS : col.BASE_COLUMNS + k] = (
            judged[:, None] & verdicts.violated[rows]
        )
        contrib[:, col.BASE_COLUMNS + k :] = judged[:, None] & ~verdicts.measured[rows]
        sec = view.sec[rows]
        firsts = np.flatnonzero(np.concatenate(([True], sec[1:] != sec[:-1])))
        return BatchCounts(
            selected=selected,
            seconds=sec[firsts],
            sums=np.add.reduceat(contrib, firsts, axis=0),
            ok_rows=rows[view.ok[rows]],
            rejected=_class_rejections(view, rows[view.rejected[rows]]),
        )

    def apply(self, view: BatchView, counts: BatchCounts, adds: SketchAdds | None) -> None:
        """Add a batch's :meth:`count` and its sketch increments (``None``: no OK rows)."""
        self._track_in_flight(view, counts.selected)
        if counts.seconds.shape[0]:
            self._add_counters(counts.seconds, counts.sums, view.now_s)
            self.dirty_minutes.update(np.unique(counts.seconds // 60).tolist())
            self._add_totals(counts.sums.sum(axis=0))
        if adds is not None:
            self._add_sketches(adds, view.now_s)
        if counts.rejected is not None:
            if self.rejected_by_class is None:
                self.rejected_by_class = RejectedByClass(self.spec.window_s)
            self.rejected_by_class.add(counts.rejected, view.now_s)

    def apply_other_vantage(self, view: BatchView, adds: SketchAdds | None) -> None:
        """Add the sketch spans of the rows the selector matches at the other vantage."""
        if adds is None:
            return
        if self.other_sketches is None:
            self.other_sketches = _sketch_tiers(self.spec.window_s)
        _add_spans(self.other_sketches, adds, view.now_s)
        # A minute with other-vantage requests only is still a minute to roll up.
        self.dirty_minutes.update({slot10 // 6 for slot10, _, _, _ in adds.spans})

    def _track_in_flight(self, view: BatchView, selected: B) -> None:
        # Per-request Python work, bounded: one dict operation per selected row.
        ids = view.request_ids
        partial = np.flatnonzero(selected & ~view.final)
        if self.in_flight:
            done = np.flatnonzero(selected & view.final)
            for i in done.tolist():
                self.in_flight.pop(ids[i], None)
        if partial.shape[0]:
            seen = float(view.now_s)
            self.in_flight.update((ids[i], seen) for i in partial.tolist())

    def _add_counters(self, seconds: I64, sums: I64, now_s: int) -> None:
        _add_to_tiers(self.counters, seconds, sums, now_s)

    def _add_totals(self, total: I64) -> None:
        good, judged = int(total[col.GOOD]), int(total[col.REQUESTS])
        self.totals["good"] += good
        self.totals["bad"] += judged - good
        self.totals["rejected"] += int(total[col.REJECTED])
        self.totals["aborted"] += int(total[col.ABORTED])
        num = len(self.keys)
        for k, key in enumerate(self.keys):
            self.violation_totals[key] += int(total[col.BASE_COLUMNS + k])
            self.measured_totals[key] += judged - int(total[col.BASE_COLUMNS + num + k])

    def _add_sketches(self, adds: SketchAdds, now_s: int) -> None:
        _add_spans(self.sketches, adds, now_s)
        self.histogram_counts += adds.histogram_counts
        for metric, total in enumerate(adds.histogram_sums):
            self.histogram_sums[metric] += total

    # -- queries ------------------------------------------------------------------------

    def window_counts(self, window_s: float, now: float) -> I64:
        """Counter sums over the ``ceil(W / r)`` slots ending with the current one."""
        return _counter_window(self.counters, window_s, now)

    def window_rejected_by_class(self, window_s: float, now: float) -> dict[str, int]:
        """Rejections per priority class over the same slots as :meth:`window_counts`."""
        if self.rejected_by_class is None:
            return {}
        return self.rejected_by_class.window(window_s, now)

    def per_minute(self, first_minute: int, last_minute: int, column: int) -> I64:
        """Counter ``column`` per minute ``first … last`` (Unix seconds // 60), from the
        minute tier; 0 for a minute it no longer holds."""
        return self.counters[1].ring.column(first_minute, last_minute, column)

    def window_sketches(self, window_s: float, now: float, *, other: bool = False) -> I64:
        """Sketch sums over the slots that cover ``[now − W, now]`` (``other``: those of
        the other vantage)."""
        tiers = self.other_sketches if other else self.sketches
        if tiers is None:  # nothing seen at the other vantage yet
            return np.zeros((len(METRICS), NUM_BUCKETS), dtype=np.int64)
        return _sketch_window(tiers, window_s, now)

    @property
    def max_window_s(self) -> float:
        return float(max(self.spec.window_s, _DAY_S))

    def in_flight_count(self, now: float, ttl_s: float) -> int:
        """Partial requests seen within ``ttl_s`` (older ones are forgotten: their final
        record was lost or will come late)."""
        # Pruning is O(size): do it at most every 10 s, so a once-a-second summary stays cheap.
        if self.in_flight and now - self._in_flight_pruned_s >= 10.0:
            horizon = now - ttl_s
            self.in_flight = {k: t for k, t in self.in_flight.items() if t >= horizon}
            self._in_flight_pruned_s = now
        return len(self.in_flight)

    def totals_snapshot(self, now: float, ttl_s: float) -> SLOTotals:
        histograms = {
            name: LatencyHistogram(
                bucket_counts=tuple(int(v) for v in self.histogram_counts[m].tolist()),
                sum_s=self.histogram_sums[m],
            )
            for m, name in enumerate(METRICS)
        }
        return SLOTotals(
            slo_id=self.spec.id,
            slo_name=self.spec.name,
            good=self.totals["good"],
            bad=self.totals["bad"],
            rejected=self.totals["rejected"],
            aborted=self.totals["aborted"],
            violations=dict(self.violation_totals),
            histograms=histograms,
            in_flight=self.in_flight_count(now, ttl_s),
            measured=dict(self.measured_totals),
        )

    # -- rollups ------------------------------------------------------------------------

    def rollup(self, minute: int) -> MinuteRollup | None:
        """The complete state of one minute, or ``None`` when no ring holds it."""
        counts = self.counters[1].ring.get(minute)
        other = None if self.other_sketches is None else self.other_sketches[1].ring.get(minute)
        if other is not None and not other.any():
            other = None
        if counts is None or not counts.any():
            if other is None:
                return None
            counts = np.zeros(col.width(len(self.keys)), dtype=np.int64)
        ring = self.sketches[1].ring
        sketches = ring.get(minute)
        if sketches is None and minute <= int(ring.slots.max()) - ring.size:
            # Rollups were not collected for over 2 h: the minute's sketches are gone.
            self.rollups_without_sketches += 1
        return MinuteRollup(
            slo_id=self.spec.id,
            minute_start=datetime.fromtimestamp(minute * 60, tz=UTC),
            requests=int(counts[col.REQUESTS]),
            good=int(counts[col.GOOD]),
            errors=int(counts[col.ERRORS]),
            aborted=int(counts[col.ABORTED]),
            rejected=int(counts[col.REJECTED]),
            output_tokens=int(counts[col.OUTPUT_TOKENS]),
            good_output_tokens=int(counts[col.GOOD_OUTPUT_TOKENS]),
            violations={k: int(counts[col.BASE_COLUMNS + i]) for i, k in enumerate(self.keys)},
            sketch_blob=encode_sketch_blob(sketches),
            unmeasured={
                k: int(counts[col.BASE_COLUMNS + len(self.keys) + i])
                for i, k in enumerate(self.keys)
            },
            rejected_by_class=(
                {} if self.rejected_by_class is None else self.rejected_by_class.minute(minute)
            ),
            other_sketch_blob=b"" if other is None else encode_sketch_blob(other),
            vantage=self.spec.vantage.name.lower(),
        )

    def held_minutes(self) -> list[int]:
        """Minutes whose sketches are still kept (the range rollups can be re-emitted for)."""
        rings = [t[1].ring for t in (self.sketches, self.other_sketches) if t is not None]
        return sorted({int(m) for ring in rings for m in ring.slots[ring.slots >= 0].tolist()})

    def load(self, rollup: MinuteRollup, now_s: int) -> None:
        """Add a rollup from storage into every ring whose range holds its minute."""
        num = len(self.keys)
        counts = np.zeros(col.width(num), dtype=np.int64)
        counts[: col.BASE_COLUMNS] = (
            rollup.requests,
            rollup.good,
            rollup.errors,
            rollup.aborted,
            rollup.rejected,
            rollup.output_tokens,
            rollup.good_output_tokens,
        )
        for k, key in enumerate(self.keys):
            counts[col.BASE_COLUMNS + k] = int(rollup.violations.get(key, 0))
            counts[col.BASE_COLUMNS + num + k] = int(rollup.unmeasured.get(key, 0))
        # The minute's per-second detail is gone: its counts go to its first second.
        second = int(rollup.minute_start.timestamp()) // 60 * 60
        self._add_counters(np.array([second]), counts[None, :], now_s)
        own, other = rollup.sketch_blob, rollup.other_sketch_blob
        if rollup.vantage and rollup.vantage != self.spec.vantage.name.lower():
            own, other = other, own  # written before the SLO's vantage changed
        _load_sketches(self.sketches, decode_sketch_blob(own), second, now_s)
        if other:
            sketches = decode_sketch_blob(other)
            if sketches.any():
                if self.other_sketches is None:
                    self.other_sketches = _sketch_tiers(self.spec.window_s)
                _load_sketches(self.other_sketches, sketches, second, now_s)
        if rollup.rejected_by_class:
            if self.rejected_by_class is None:
                self.rejected_by_class = RejectedByClass(self.spec.window_s)
            names = list(rollup.rejected_by_class)
            sums = np.array([[rollup.rejected_by_class[n] for n in names]], dtype=np.int64)
            self.rejected_by_class.add(ClassRejections(names, np.array([second]), sums), now_s)

    @property
    def nbytes(self) -> int:
        counters = sum(t.ring.nbytes for t in self.counters)
        sketches = sum(t.ring.nbytes for t in (*self.sketches, *(self.other_sketches or ())))
        classes = 0 if self.rejected_by_class is None else self.rejected_by_class.nbytes
        return int(counters + sketches + classes + self.histogram_counts.nbytes)


def _load_sketches(tiers: list[_Tier[SketchRing]], sketches: I64, second: int, now_s: int) -> None:
    """Add a decoded rollup's sketches at ``second`` to every tier whose range holds it."""
    for tier in tiers:
        slot = second // tier.ring.resolution_s
        if tier.holds_slot(slot, now_s):
            tier.ring.add_dense(slot, sketches)


def _class_rejections(view: BatchView, rows: I64) -> ClassRejections | None:
    """The rejected ``rows`` (ascending) counted per finish second and priority class."""
    if rows.shape[0] == 0:
        return None
    sec = view.sec[rows]
    firsts = np.flatnonzero(np.concatenate(([True], sec[1:] != sec[:-1])))
    column = view.labels.get("priority")
    codes = np.zeros(rows.shape[0], dtype=np.uint32) if column is None else column.codes[rows]
    values = [""] if column is None else column.values
    if (codes == codes[0]).all():  # the common case: one class
        per_second = np.diff(np.append(firsts, rows.shape[0]))
        return ClassRejections([values[int(codes[0])]], sec[firsts], per_second[:, None])
    present, inverse = np.unique(codes, return_inverse=True)
    group = np.repeat(np.arange(firsts.shape[0]), np.diff(np.append(firsts, rows.shape[0])))
    width = present.shape[0]
    counts = np.bincount(group * width + inverse.reshape(-1), minlength=firsts.shape[0] * width)
    names = [values[c] for c in present.tolist()]
    return ClassRejections(names, sec[firsts], counts.reshape(-1, width).astype(np.int64))
