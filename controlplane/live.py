"""The live goodput runtime: the app's one :class:`GoodputEngine`, fed and persisted.

:class:`LiveGoodput` owns, for the life of the app:

* the engine, with the SLO set of the database: loaded at start, and reloaded whenever the
  ``slo`` table changes. The loop polls one cheap aggregate (row count, sum of versions,
  latest update) every ``slo_poll_interval_s``, so every way an SLO changes (REST, CLI,
  another replica's registry) is seen within that interval; a route that reads an SLO the
  engine does not have yet calls :meth:`refresh_slos` itself (read-your-writes);
* the history: minute rollups of each SLO's compliance window (at least a day) are loaded
  when the SLO enters the engine; complete minutes are upserted every
  ``rollup_interval_s`` in one transaction; a graceful stop also writes the current minute.
  A failed write keeps its rows (the newest version of each minute) and retries next time;
* the :class:`~controlplane.ingest.Ingestor` (de-duplication + engine) and the app's
  Prometheus registry (engine, ingest and process metrics; never the global registry).

The loop is one asyncio task stopped by an ``asyncio.Event`` (:attr:`stopping`, which the
SSE streams watch too). ASGI servers such as uvicorn drain open connections *before* the
lifespan shutdown, so an open SSE stream would hold a graceful shutdown up for good: the
lifespan therefore chains a handler in front of the server's SIGINT/SIGTERM handlers that
sets :attr:`stopping` as soon as shutdown begins (main thread only; the server's own
handler then runs as before). Engine work runs in worker threads (the engine is thread-safe).
One replica owns the engine: ingest is not sharded between control-plane processes.

Example::

    live = LiveGoodput(app.state.sessions, settings, registry=CollectorRegistry())
    await live.start()
    ...
    await live.stop()
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import sqlalchemy as sa
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.goodput import GoodputCollector, GoodputEngine, MinuteRollup, SLOSpec
from controlplane.ingest import Deduplicator, IngestCollector, Ingestor
from controlplane.models import SLO, GoodputRollup
from controlplane.services.slos import live_specs
from controlplane.settings import Settings

__all__ = [
    "MAX_PENDING_ROLLUPS",
    "LiveGoodput",
    "app_registry",
    "chain_exit_signals",
    "live_lifespan",
]

logger = logging.getLogger(__name__)

#: Rollup rows kept for retry while the database refuses writes (oldest dropped, counted).
MAX_PENDING_ROLLUPS = 200_000
_DAY_S = 86_400.0
_ROLLUP_COLUMNS = (
    "requests",
    "good",
    "errors",
    "aborted",
    "rejected",
    "output_tokens",
    "good_output_tokens",
    "violations",
    "sketch_blob",
)
Fingerprint = tuple[int, int, str]


class LiveGoodput:
    """The engine's runtime inside the app (see the module)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sessions = sessions
        self.settings = settings
        self.clock = clock
        self.engine = GoodputEngine(clock=clock, recent_rows_cap=settings.dry_run_max_rows)
        self.ingestor = Ingestor(
            self.engine,
            Deduplicator(settings.ingest_dedup_window, settings.ingest_max_exporters),
        )
        self.stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._fingerprint: Fingerprint | None = None
        self._reload_lock = asyncio.Lock()
        self._pending: dict[tuple[str, datetime], MinuteRollup] = {}
        self._next_rollup_at = 0.0
        self._failing = False
        self._counts = dict.fromkeys(
            ("reloads", "rollups_written", "rollups_dropped", "write_failures", "loaded"), 0
        )
        self._registry = registry
        self._collectors: list[Collector] = []
        if registry is not None:
            self._collectors = [
                GoodputCollector(self.engine),
                IngestCollector(self.ingestor),
                _RuntimeCollector(self),
            ]
            for collector in self._collectors:
                registry.register(collector)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the SLO set and its history, then start the loop."""
        await self.refresh_slos(force=True)
        self._next_rollup_at = self.clock() + self.settings.rollup_interval_s
        self._task = asyncio.create_task(self._run(), name="goodput-live")

    async def stop(self) -> None:
        """Stop the loop (idempotent) and write every minute held, the current one too."""
        self.stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        await task
        await self.write_rollups(until_time=self.clock() + 60.0)
        if self._registry is not None:
            # The app may start again (tests, embedders): its registry must not keep us.
            for collector in self._collectors:
                self._registry.unregister(collector)

    # -- SLO set ----------------------------------------------------------------------------

    async def refresh_slos(self, *, force: bool = False) -> bool:
        """Reload the SLO set if the ``slo`` table changed (always with ``force``); load
        the history of SLOs new to the engine. Returns whether the set was reloaded."""
        async with self._reload_lock:
            async with self.sessions() as session:
                fingerprint = await _fingerprint(session)
                if not force and fingerprint == self._fingerprint:
                    return False
                specs = await live_specs(session)
            known = {s.id for s in self.engine.slos}
            await asyncio.to_thread(self.engine.set_slos, specs)
            added = [s for s in specs if s.id not in known]
            if added:
                rollups = await self._load_rollups(added)
                self._counts["loaded"] += await asyncio.to_thread(self.engine.load_rollups, rollups)
            self._fingerprint = fingerprint
            self._counts["reloads"] += 1
            logger.info("goodput engine has %d SLO(s) (%d new)", len(specs), len(added))
            return True

    def spec(self, slo_id: str) -> SLOSpec | None:
        """The spec the engine holds for ``slo_id`` (``None`` when it has none)."""
        return next((s for s in self.engine.slos if s.id == slo_id), None)

    async def _load_rollups(self, specs: Iterable[SLOSpec]) -> list[MinuteRollup]:
        now = self.clock()
        out: list[MinuteRollup] = []
        async with self.sessions() as session:
            for spec in specs:
                since = datetime.fromtimestamp(now - max(spec.window_s, _DAY_S), tz=UTC)
                rows = await session.scalars(
                    sa.select(GoodputRollup)
                    .where(
                        GoodputRollup.slo_id == uuid.UUID(spec.id),
                        GoodputRollup.minute_start >= since,
                    )
                    .order_by(GoodputRollup.minute_start)
                )
                out.extend(_to_rollup(row) for row in rows)
        return out

    # -- rollups ----------------------------------------------------------------------------

    async def write_rollups(self, until_time: float | None = None) -> int:
        """Upsert the minutes complete by ``until_time`` (default now) that are new or
        changed, plus any left from a failed write, in one transaction. Returns the rows
        written; on a database error keeps them for the next call and returns 0."""
        until = self.clock() if until_time is None else until_time
        for rollup in await asyncio.to_thread(self.engine.rollups, until):
            self._pending[(rollup.slo_id, rollup.minute_start)] = rollup
        self._trim_pending()
        if not self._pending:
            return 0
        rows = [_row(r) for r in self._pending.values()]
        try:
            async with self.sessions() as session, session.begin():
                dialect = session.get_bind().dialect.name
                await session.execute(_upsert(dialect), rows)
        except Exception:  # any database failure: keep the rows, retry next time
            self._counts["write_failures"] += 1
            if not self._failing:
                logger.exception("writing %d goodput rollup(s) failed; will retry", len(rows))
            self._failing = True
            return 0
        if self._failing:
            logger.warning("goodput rollups written again (%d rows)", len(rows))
        self._failing = False
        self._pending.clear()
        self._counts["rollups_written"] += len(rows)
        return len(rows)

    def _trim_pending(self) -> None:
        excess = len(self._pending) - MAX_PENDING_ROLLUPS
        if excess > 0:
            for key in sorted(self._pending, key=lambda k: k[1])[:excess]:
                del self._pending[key]
            self._counts["rollups_dropped"] += excess

    # -- the loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        interval = self.settings.slo_poll_interval_s
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self.stopping.wait(), timeout=interval)
                return
            except TimeoutError:
                pass
            await self.tick()

    async def tick(self) -> None:
        """One loop step: reload SLOs if they changed; write rollups when due."""
        try:
            await self.refresh_slos()
        except Exception:  # the database may be away: keep the last SLO set
            logger.warning("polling the SLO table failed; keeping the current SLO set")
        now = self.clock()
        if now >= self._next_rollup_at:
            self._next_rollup_at = now + self.settings.rollup_interval_s
            await self.write_rollups(now)

    def counts(self) -> dict[str, int]:
        """Runtime counters: reloads, rollups written/dropped/loaded, write failures."""
        return {**self._counts, "rollups_pending": len(self._pending)}


async def _fingerprint(session: AsyncSession) -> Fingerprint:
    """Changes whenever an SLO is created (count), updated or deleted (versions, time)."""
    row = (
        await session.execute(
            sa.select(
                sa.func.count(),
                sa.func.coalesce(sa.func.sum(SLO.version), 0),
                sa.func.max(SLO.updated_at),
            )
        )
    ).one()
    return int(row[0]), int(row[1]), str(row[2])


def _to_rollup(row: GoodputRollup) -> MinuteRollup:
    return MinuteRollup(
        slo_id=str(row.slo_id),
        minute_start=row.minute_start,
        requests=row.requests,
        good=row.good,
        errors=row.errors,
        aborted=row.aborted,
        rejected=row.rejected,
        output_tokens=row.output_tokens,
        good_output_tokens=row.good_output_tokens,
        violations=dict(row.violations),
        sketch_blob=bytes(row.sketch_blob),
    )


def _row(rollup: MinuteRollup) -> dict[str, object]:
    return {
        "slo_id": uuid.UUID(rollup.slo_id),
        "minute_start": rollup.minute_start,
        **{name: getattr(rollup, name) for name in _ROLLUP_COLUMNS},
    }


def _upsert(dialect: str) -> sa.Executable:
    """``INSERT … ON CONFLICT (slo_id, minute_start) DO UPDATE`` on either backend."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(GoodputRollup)
    return statement.on_conflict_do_update(
        index_elements=[GoodputRollup.slo_id, GoodputRollup.minute_start],
        set_={name: statement.excluded[name] for name in _ROLLUP_COLUMNS},
    )


class _RuntimeCollector:
    """``goodput_rollup_*`` and ``goodput_slo_reloads_total`` from the runtime's counters."""

    def __init__(self, live: LiveGoodput) -> None:
        self._live = live

    def collect(self) -> Iterator[Metric]:
        counts = self._live.counts()
        yield CounterMetricFamily(
            "goodput_slo_reloads", "SLO set reloads into the engine.", value=counts["reloads"]
        )
        written = CounterMetricFamily(
            "goodput_rollup_rows",
            "Minute rollup rows by outcome: written, dropped (retry buffer full), loaded.",
            labels=["outcome"],
        )
        for outcome in ("written", "dropped", "loaded"):
            key = outcome if outcome == "loaded" else f"rollups_{outcome}"
            written.add_metric([outcome], counts[key])
        yield written
        yield CounterMetricFamily(
            "goodput_rollup_write_failures",
            "Rollup writes the database refused (rows kept for retry).",
            value=counts["write_failures"],
        )
        yield GaugeMetricFamily(
            "goodput_rollup_rows_pending",
            "Rollup rows waiting for a successful write.",
            value=counts["rollups_pending"],
        )


def app_registry() -> CollectorRegistry:
    """A registry of the app's own (process and platform metrics; never the global one)."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


@asynccontextmanager
async def live_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the runtime on ``app.state.live`` (registry ``app.state.metrics_registry``)."""
    registry = getattr(app.state, "metrics_registry", None)
    if registry is None:
        registry = app.state.metrics_registry = app_registry()
    live = LiveGoodput(app.state.sessions, app.state.settings, registry=registry)
    await live.start()
    app.state.live = live
    loop = asyncio.get_running_loop()
    restore = chain_exit_signals(lambda: loop.call_soon_threadsafe(live.stopping.set))
    try:
        yield
    finally:
        restore()
        await live.stop()


def chain_exit_signals(callback: Callable[[], object]) -> Callable[[], None]:
    """Run ``callback`` before the current SIGINT/SIGTERM handlers (the server's graceful
    shutdown), and return a function that puts those handlers back. Does nothing outside
    the main thread (signals are delivered there only) or for a signal without a Python
    handler (its default already ends the process)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    installed: dict[int, tuple[object, object]] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: object, previous: Callable[..., object] = previous) -> None:
            callback()
            previous(signum, frame)

        signal.signal(sig, handler)
        installed[sig] = (handler, previous)

    def restore() -> None:
        for sig, (handler, previous) in installed.items():
            if signal.getsignal(sig) is handler:  # unless someone replaced it since
                signal.signal(sig, previous)  # type: ignore[arg-type]

    return restore
