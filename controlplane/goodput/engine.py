"""The live goodput engine: request records in, goodput per SLO and window out, in memory.

Pure: no I/O, no framework; time comes from an injected clock (wall-clock seconds) or an
explicit ``now``. The control plane feeds it decoded batches (after de-duplication by
exporter sequence), reads window stats for REST, SSE and ``/metrics``, and persists its
minute rollups. See ``docs/goodput-engine.md`` for the design, bounds and semantics.

Example::

    engine = GoodputEngine(clock=time.time)
    engine.set_slos([SLOSpec(id="chat", name="chat", target=0.99, window_s=28 * 86400,
                             objectives=(Objective(Metric.TTFT, 0.2),))])
    engine.ingest(batch)
    stats = engine.query("chat", "5m")
    print(stats.goodput_rps, stats.attainment_ratio, stats.ttft.p99_s)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from controlplane.goodput._batch import METRICS, BatchView
from controlplane.goodput._recent import RecentStore
from controlplane.goodput._sketch_adds import sketch_adds
from controlplane.goodput._slo_state import SLOState
from controlplane.goodput._summarize import GOOD, build_stats
from controlplane.goodput._summarize import percentiles as sketch_percentiles
from controlplane.goodput.spec import SLOSpec, SpecError
from controlplane.goodput.stats import (
    COMPLIANCE,
    STANDARD_WINDOWS,
    EngineHealth,
    GoodputStats,
    LatencyPercentiles,
    MinuteRollup,
    SLOTotals,
)
from exporters.records import RecordBatch, Vantage

__all__ = ["DEFAULT_ITL_PERCENTILES", "GoodputEngine", "UnknownSLOError"]

#: Per-request ITL percentiles kept for dry runs (ITL objectives ``"pNN"`` with these NN).
DEFAULT_ITL_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
#: A partial record not followed by its final one within this time stops counting in flight.
IN_FLIGHT_TTL_S = 600.0
I64 = npt.NDArray[np.int64]


class UnknownSLOError(KeyError):
    """A query named an SLO id the engine does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


class GoodputEngine:
    """Goodput per SLO over sliding windows, from request records (see the module).

    ``clock`` returns wall-clock seconds (``time.time`` in production, a fake in tests);
    every method taking ``now`` uses the clock when it is ``None``. ``recent_rows_cap``
    bounds the dry-run store (about 102 bytes a row); ``itl_percentiles`` are the ITL
    percentiles it keeps per request; ``other_vantage`` keeps, per SLO, the latency
    sketches of the requests its selector matches at the other vantage too (see
    :meth:`vantage_percentiles`). Thread-safe: every public method holds one lock.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        *,
        recent_rows_cap: int = 1_000_000,
        itl_percentiles: Sequence[float] = DEFAULT_ITL_PERCENTILES,
        other_vantage: bool = True,
    ) -> None:
        self._clock = clock
        self._other_vantage = other_vantage
        self._lock = threading.RLock()
        self._states: dict[str, SLOState] = {}
        self._recent = RecentStore(recent_rows_cap, tuple(sorted(set(itl_percentiles))))
        self.start_time = float(clock())
        self._history_start = self.start_time
        self._rollups_without_sketches = 0  # of SLOs since removed
        self._health = dict.fromkeys(
            ("records", "final", "in_flight_updates", "late", "dropped_late", "dropped_future"),
            0,
        )

    # -- SLO set ------------------------------------------------------------------------

    def set_slos(self, specs: Iterable[SLOSpec]) -> None:
        """Make ``specs`` the SLO set: new ids start empty, missing ids are dropped with
        their history, and a changed spec for a known id keeps its history. Past verdicts
        are not recomputed: each request stays judged by the spec in force when it was
        ingested; violation counts follow objective keys (a new key starts at 0)."""
        specs = list(specs)
        ids = [s.id for s in specs]
        duplicate = next((i for k, i in enumerate(ids) if i in ids[:k]), None)
        if duplicate is not None:
            raise SpecError(f"id: {duplicate!r} appears twice in the SLO set; ids must be unique")
        with self._lock:
            states: dict[str, SLOState] = {}
            for spec in specs:
                state = self._states.get(spec.id)
                if state is None:
                    state = SLOState(spec)
                elif state.spec != spec:
                    state.update_spec(spec)
                states[spec.id] = state
            for slo_id, gone in self._states.items():
                if slo_id not in states:
                    self._rollups_without_sketches += gone.rollups_without_sketches
            self._states = states

    @property
    def slos(self) -> list[SLOSpec]:
        """The SLO specs in force, in the order given to :meth:`set_slos`."""
        with self._lock:
            return [s.spec for s in self._states.values()]

    def now(self) -> float:
        """The engine's clock now (wall-clock seconds)."""
        return self._now(None)

    # -- ingest -------------------------------------------------------------------------

    def ingest(
        self, batch: RecordBatch, *, validate: bool = True, now: float | None = None
    ) -> None:
        """Count one batch into every SLO (once; never rescans history).

        Final records count by finish time (arrival + E2EL, else arrival); partial ones
        only update the in-flight gauge. Records finishing more than 2 h before ``now`` or
        more than 60 s after it are dropped and counted in :meth:`health`. ``validate``
        checks the batch first (pass ``False`` for one the wire decoder validated);
        raises :class:`~exporters.records.RecordError` naming the bad field.
        """
        with self._lock:
            now = self._now(now)
            needed = set(self._recent.itl_percentiles)
            for state in self._states.values():
                needed.update(
                    p for p in (o.percentile for o in state.spec.objectives) if p is not None
                )
            view = BatchView.build(batch, now, validate=validate, itl_percentiles=needed)
            # Everything is computed before anything changes: a batch on which the engine
            # fails is not half applied. The sketches of every SLO are one pass.
            states = list(self._states.values())
            counts = [state.count(view) for state in states]
            selections = [c.ok_rows for c in counts]
            if self._other_vantage:
                # A batch comes from one exporter, so mostly from one vantage: the SLOs of
                # the other vantage then select nothing there and cost one check.
                present = {int(v) for v in np.unique(view.vantage).tolist()}
                selections += [self._other_vantage_rows(view, s.spec, present) for s in states]
            adds = sketch_adds(view, selections)
            own_adds = adds[: len(states)]
            for state, batch_counts, batch_adds in zip(states, counts, own_adds, strict=True):
                state.apply(view, batch_counts, batch_adds)
            if self._other_vantage:
                for state, other_adds in zip(states, adds[len(states) :], strict=True):
                    state.apply_other_vantage(view, other_adds)
            self._recent.expire(now)
            self._recent.append(view)
            num_final = int(view.final.sum())
            if view.accepted.any():
                earliest = float(view.sec[view.accepted].min())
                self._history_start = min(self._history_start, earliest)
            health = self._health
            health["records"] += len(view)
            health["final"] += num_final
            health["in_flight_updates"] += len(view) - num_final
            health["late"] += view.num_late
            health["dropped_late"] += view.num_dropped_late
            health["dropped_future"] += view.num_dropped_future

    # -- queries ------------------------------------------------------------------------

    def query(
        self,
        slo_id: str,
        window: str | float,
        now: float | None = None,
        *,
        percentiles: bool = True,
    ) -> GoodputStats:
        """Stats of SLO ``slo_id`` over ``window``: a name of ``STANDARD_WINDOWS``,
        ``"compliance"``, or seconds up to ``max(compliance window, 1 d)``. Skip the
        sketches with ``percentiles=False`` when only counts and ratios are needed."""
        with self._lock:
            state = self._state(slo_id)
            now = self._now(now)
            return self._stats(state, self._window_s(state, window), now, percentiles)

    def query_if_free(
        self, slo_id: str, window: str | float, now: float | None = None
    ) -> GoodputStats | None:
        """:meth:`query` if the engine's lock is free now, else ``None`` at once (never
        waits): an event loop answers a short query itself while no batch is being
        counted, and hands it to a worker thread otherwise."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self.query(slo_id, window, now)
        finally:
            self._lock.release()

    def summary(
        self, now: float | None = None, window: str | float = "1m", *, percentiles: bool = True
    ) -> list[GoodputStats]:
        """Stats of every SLO over ``window`` (default 1 min), e.g. once a second for SSE."""
        with self._lock:
            now = self._now(now)
            return [
                self._stats(s, self._window_s(s, window), now, percentiles)
                for s in self._states.values()
            ]

    def summaries(
        self, windows: Mapping[str, float], now: float | None = None
    ) -> dict[str, list[GoodputStats]]:
        """Stats without percentiles of every SLO over each of ``windows`` (name → seconds),
        in one pass: each SLO's compliance window is summed once, not once per window."""
        with self._lock:
            now = self._now(now)
            out: dict[str, list[GoodputStats]] = {name: [] for name in windows}
            for state in self._states.values():
                compliance_s = float(state.spec.window_s)
                compliance = state.window_counts(compliance_s, now)
                for name, window in windows.items():
                    window_s = self._window_s(state, window)
                    out[name].append(self._stats(state, window_s, now, False, compliance))
            return out

    def good_per_minute(self, first_minute: int, last_minute: int) -> dict[str, list[int]]:
        """Good requests of every SLO in each minute ``first … last`` (Unix seconds // 60,
        inclusive), read from the per-minute counters; 0 for a minute no longer held.
        Cheap enough for a sparkline of every SLO."""
        with self._lock:
            return {
                slo_id: state.per_minute(first_minute, last_minute, GOOD).tolist()
                for slo_id, state in self._states.items()
            }

    def rejected_by_class(
        self, slo_id: str, window: str | float, now: float | None = None
    ) -> dict[str, int]:
        """Rejections of SLO ``slo_id`` over ``window`` per priority class (the records'
        ``priority`` label, ``""`` for none): the classes seen since the engine started,
        at most ``MAX_CLASSES`` of them, later ones summed as ``"other"``. Over the same
        slots as :meth:`query`'s ``rejected``, which they sum to (rollups store the classes
        and :meth:`load_rollups` restores them)."""
        with self._lock:
            state = self._state(slo_id)
            now = self._now(now)
            return state.window_rejected_by_class(self._window_s(state, window), now)

    def vantage_percentiles(
        self, slo_id: str, window: str | float, now: float | None = None
    ) -> dict[str, dict[str, LatencyPercentiles]]:
        """Latency percentiles of SLO ``slo_id``'s selector at each vantage (name →
        metric → percentiles) over ``window``: the SLO's own vantage from the sketches
        of the requests it judges (as :meth:`query`), the other from the OK requests the
        selector matches there (every metric's percentiles ``None`` when the engine keeps
        no other-vantage sketches)."""
        with self._lock:
            state = self._state(slo_id)
            now = self._now(now)
            window_s = self._window_s(state, window)
            own = state.spec.vantage
            out: dict[str, dict[str, LatencyPercentiles]] = {}
            for vantage in Vantage:
                other = vantage is not own
                sketches = (
                    None
                    if other and not self._other_vantage
                    else state.window_sketches(window_s, now, other=other)
                )
                out[vantage.name.lower()] = {
                    name: sketch_percentiles(None if sketches is None else sketches[m])
                    for m, name in enumerate(METRICS)
                }
            return out

    def dry_run(
        self, spec: SLOSpec, window_s: float = 3600.0, now: float | None = None
    ) -> GoodputStats:
        """What ``spec`` (a candidate; need not be in the SLO set) would have measured over
        the last ``window_s`` (at most 1 h) of stored requests, judged now with its
        objectives. Rows evicted by the store's cap are missing: rates then divide by the
        span still covered. ITL percentiles are ``None`` (gaps are not stored) and the
        error budget is computed over the dry-run window itself. Raises :class:`SpecError`
        for a window out of range or an ITL percentile statistic that is not stored."""
        retention = self._recent.retention_s
        if not (math.isfinite(window_s) and 0 < window_s <= retention):
            raise SpecError(f"window_s must be in (0, {retention:g}] for a dry run, got {window_s}")
        with self._lock:
            now = self._now(now)
            counts, sketches = self._recent.evaluate(spec, window_s, now)
            covered_from = max(self._history_start, self._recent.evicted_through_s)
            return build_stats(
                spec,
                spec.objective_keys,
                window_s=float(window_s),
                time=now,
                duration_s=min(window_s, now - covered_from),
                counts=counts,
                compliance_counts=counts,
                sketches=sketches,
            )

    def health(self) -> EngineHealth:
        """Cumulative counts of what happened to ingested records (see EngineHealth)."""
        with self._lock:
            return EngineHealth(
                **self._health,
                recent_rows=self._recent.rows,
                recent_evicted=self._recent.evicted,
                rollups_without_sketches=self._rollups_without_sketches
                + sum(s.rollups_without_sketches for s in self._states.values()),
            )

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held: ``"slos"`` (rings, sketches, histograms of every SLO) and
        ``"dry_run_store"`` (the recent-request columns)."""
        with self._lock:
            return {
                "slos": sum(s.nbytes for s in self._states.values()),
                "dry_run_store": self._recent.nbytes,
            }

    def totals(self, now: float | None = None) -> list[SLOTotals]:
        """Lifetime totals of every SLO since engine start (for Prometheus counters and
        histograms), with the live in-flight gauge."""
        with self._lock:
            now = self._now(now)
            return [s.totals_snapshot(now, IN_FLIGHT_TTL_S) for s in self._states.values()]

    # -- rollups ------------------------------------------------------------------------

    def rollups(self, until_time: float) -> list[MinuteRollup]:
        """Rollups of the complete minutes (ending by ``until_time``) that are new or
        changed since last emitted, by SLO then minute. A late record re-emits its minute
        with full counts, so the store upserts by (slo_id, minute_start). Call it at least
        every 2 h (every minute in production): a minute older than that has lost its
        sketches and is emitted with counts only (counted in :meth:`health`)."""
        until_minute = math.floor(until_time) // 60
        out: list[MinuteRollup] = []
        with self._lock:
            for state in self._states.values():
                ready = sorted(m for m in state.dirty_minutes if m < until_minute)
                state.dirty_minutes.difference_update(ready)
                out.extend(r for m in ready if (r := state.rollup(m)) is not None)
        return out

    def reemit_rollups(self, since_time: float, until_time: float) -> list[MinuteRollup]:
        """Rollups of every complete minute in ``[since_time, until_time)`` still held at
        minute resolution (the last 2 h), e.g. after a failed write."""
        first, end = math.floor(since_time) // 60, math.floor(until_time) // 60
        out: list[MinuteRollup] = []
        with self._lock:
            for state in self._states.values():
                minutes = sorted(m for m in state.held_minutes() if first <= m < end)
                out.extend(r for m in minutes if (r := state.rollup(m)) is not None)
        return out

    def load_rollups(self, rollups: Iterable[MinuteRollup], now: float | None = None) -> int:
        """Restore history from stored rollups at start, before the first :meth:`ingest`.

        Each minute goes to every ring whose range holds it (its per-second detail is
        lost: the short rings get it at the minute's first second). Rollups of SLO ids
        not in the set are skipped. Returns how many were loaded. What a restart loses:
        minutes not yet emitted (at most the last unflushed one when rollups are flushed
        every minute), per-second detail, the in-flight gauge, the dry-run store and the
        lifetime totals behind Prometheus counters (which restart from 0, as counters may).
        """
        loaded = 0
        with self._lock:
            now_s = math.floor(self._now(now))
            for rollup in rollups:
                state = self._states.get(rollup.slo_id)
                if state is None:
                    continue
                if rollup.minute_start.tzinfo is None:
                    raise SpecError(
                        f"minute_start must be timezone-aware (UTC), got {rollup.minute_start!r}"
                    )
                state.load(rollup, now_s)
                start = rollup.minute_start.timestamp()
                self._history_start = min(self._history_start, start)
                loaded += 1
        return loaded

    # -- internals ----------------------------------------------------------------------

    def _now(self, now: float | None) -> float:
        return float(self._clock()) if now is None else float(now)

    def _state(self, slo_id: str) -> SLOState:
        state = self._states.get(slo_id)
        if state is None:
            raise UnknownSLOError(f"slo_id: no SLO {slo_id!r}; known: {sorted(self._states)}")
        return state

    @staticmethod
    def _other_vantage_rows(view: BatchView, spec: SLOSpec, present: set[int]) -> I64:
        """Accepted OK rows that ``spec``'s selector matches at the other vantage
        (``present``: the vantages the batch has rows of)."""
        other = Vantage.ENGINE if spec.vantage is Vantage.GATEWAY else Vantage.GATEWAY
        if int(other) not in present:
            return np.zeros(0, dtype=np.int64)
        rows: I64 = np.flatnonzero(view.selection(spec, other) & view.accepted & view.ok)
        return rows

    @staticmethod
    def _window_s(state: SLOState, window: str | float) -> float:
        if isinstance(window, str):
            if window == COMPLIANCE:
                return float(state.spec.window_s)
            if window in STANDARD_WINDOWS:
                return STANDARD_WINDOWS[window]
            raise SpecError(
                f"window: unknown name {window!r}; allowed: "
                f"{[*STANDARD_WINDOWS, COMPLIANCE]} or seconds"
            )
        if isinstance(window, bool) or not (
            math.isfinite(window) and 0 < window <= state.max_window_s
        ):
            raise SpecError(
                f"window must be in (0, {state.max_window_s:g}] seconds for SLO "
                f"{state.spec.id!r}, got {window!r}"
            )
        return float(window)

    def _stats(
        self,
        state: SLOState,
        window_s: float,
        now: float,
        percentiles: bool,
        compliance: I64 | None = None,
    ) -> GoodputStats:
        compliance_s = float(state.spec.window_s)
        counts = state.window_counts(window_s, now)
        if compliance_s == window_s:
            compliance = counts
        elif compliance is None:
            compliance = state.window_counts(compliance_s, now)
        return build_stats(
            state.spec,
            state.keys,
            window_s=window_s,
            time=now,
            duration_s=min(window_s, now - self._history_start),
            counts=counts,
            compliance_counts=compliance,
            sketches=state.window_sketches(window_s, now) if percentiles else None,
            in_flight=state.in_flight_count(now, IN_FLIGHT_TTL_S),
        )
