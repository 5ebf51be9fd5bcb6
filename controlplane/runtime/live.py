"""The live goodput runtime: the app's one :class:`GoodputEngine`, fed and persisted.

:class:`LiveGoodput` owns, for the life of the app:

* the engine, with the SLO set of the database: loaded at start, and reloaded whenever the
  ``slo`` table changes. The loop polls one cheap aggregate (row count, sum of versions,
  latest update) every ``slo_poll_interval_s``, so every way an SLO changes (REST, CLI,
  another replica's registry) is seen within that interval; a route that reads an SLO the
  engine does not have yet calls :meth:`refresh_slos` itself (read-your-writes). Each
  poll that succeeds also stores the live SLOs in the SLO cache
  (``controlplane.services.slos_cache``), so goodput queries find theirs without a read;
* the history: minute rollups of each SLO's compliance window (at least a day) are loaded
  when the SLO enters the engine, in the same step; complete minutes are upserted every
  ``rollup_interval_s`` in one transaction; a graceful stop also writes the current minute.
  A failed write keeps its rows (the newest version of each minute) and retries next time;
* the :class:`~controlplane.ingest.Ingestor` (de-duplication + engine) and the app's
  Prometheus registry (engine, ingest and process metrics; never the global registry).

**Without a database.** The app starts when the database is down, slow or not migrated:
the engine starts empty (:attr:`~LiveGoodput.loaded` false, :attr:`~LiveGoodput.load_error`
says why, logged once), the loop retries with backoff (0.5 s doubling to
``database_retry_max_s``), and routes that need the SLO set call
:meth:`~LiveGoodput.ensure_loaded`, which tries at once: ``/ready`` and ingest answer 503
until the set is loaded, so exporters keep their batches and resend them (nothing is lost;
a refused batch is not marked as seen, so nothing is counted twice). Once loaded, the set
stays: a later outage keeps the last set and retries its writes.

The loop is one asyncio task stopped by an ``asyncio.Event`` (:attr:`stopping`, which the
SSE streams watch too; ``controlplane.main.live_lifespan`` also sets it when the server
begins a graceful shutdown). Engine work runs in worker threads (the engine is
thread-safe). With ``fleet_ingest`` the replicas sharing the database count every
replica's batches from the fleet log (:meth:`LiveGoodput.read_fleet_log`), and the leader
alone writes the rollups and the log's checkpoint (docs/scale-out.md).

Example::

    live = LiveGoodput(app.state.sessions, settings, registry=CollectorRegistry())
    await live.start()
    ...
    await live.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from controlplane.errors import describe_error
from controlplane.goodput import GoodputCollector, GoodputEngine, MinuteRollup, SLOSpec
from controlplane.ingest import Deduplicator, IngestCollector, Ingestor
from controlplane.ingest.fleet_log import FLEET_EPOCH, FleetLog
from controlplane.ingest.replay import replay
from controlplane.ingest.wal import WalError, WriteAheadLog
from controlplane.runtime.leadership import Leadership, default_replica_id
from controlplane.services import rollups as rollup_service
from controlplane.services import slos as slo_service
from controlplane.services.slos_cache import CachedSLO, SLOCache, slo_cache
from controlplane.settings import Settings

__all__ = [
    "MAX_PENDING_ROLLUPS",
    "LiveGoodput",
    "app_registry",
]

logger = logging.getLogger(__name__)

#: Rollup rows kept for retry while the database refuses writes (oldest dropped, counted).
MAX_PENDING_ROLLUPS = 200_000
# First wait before retrying a failed load; it doubles up to settings.database_retry_max_s.
_RETRY_INITIAL_S = 0.5
# How long stop() lets the loop finish a step before cancelling it (a database that hangs).
_STOP_GRACE_S = 5.0
_COUNTS = (
    "wal_replayed_records",
    "wal_segments_released",
    "reloads",
    "rollups_written",
    "rollups_dropped",
    "write_failures",
    "loaded",
    "load_failures",
    "fleet_rows_released",
)
Fingerprint = tuple[int, int, str]


@dataclass(frozen=True, slots=True)
class WalCheckpointState:
    """The database's checkpoint of the write-ahead log (see ``controlplane.ingest.replay``)."""

    epoch: str
    segment: int
    covered_until_minute: int
    dedup: bytes


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
        self._first_attempt = asyncio.Event()
        self._attempt: asyncio.Future[None] | None = None
        self._fingerprint: Fingerprint | None = None
        self._reload_lock = asyncio.Lock()
        self._loaded = False
        self._load_error: str | None = None
        self._pending: dict[tuple[str, datetime], MinuteRollup] = {}
        self._next_rollup_at = 0.0
        self._failing = False
        self._poll_failing = False
        self._counts = dict.fromkeys(_COUNTS, 0)
        #: The replicas' lease (set by ``leadership_lifespan``): with the fleet log, only
        #: its holder writes rollups.
        self.leadership: Leadership | None = None
        self._fleet_covered: tuple[int, int] | None = None
        self._fleet_task: asyncio.Task[None] | None = None
        #: Set when this replica commits to the fleet log: its reader reads at once.
        self._fleet_committed = asyncio.Event()
        self._was_leading = False
        self._registry = registry
        self._collectors: list[Collector] = []
        if registry is not None:
            self._collectors = [
                _LeaderOnly(GoodputCollector(self.engine), self),
                IngestCollector(self.ingestor),
                _RuntimeCollector(self),
            ]
            for collector in self._collectors:
                registry.register(collector)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the loop, whose first step loads the SLO set and its history, and wait for
        that attempt at most ``ready_timeout_s``. The database never stops the start: down,
        slow or not migrated, the engine starts empty (:attr:`loaded` false) and the loop
        retries with backoff until the load succeeds."""
        self._next_rollup_at = self.clock() + self.settings.rollup_interval_s
        self._task = asyncio.create_task(self._run(), name="goodput-live")
        timeout_s = self.settings.ready_timeout_s
        try:
            await asyncio.wait_for(self._first_attempt.wait(), timeout_s)
        except TimeoutError:  # the attempt goes on in the loop: it is never cancelled
            if not self._loaded and self._load_error is None:
                self._load_error = f"the database did not answer within {timeout_s} s"

    async def stop(self) -> None:
        """Stop the loop (idempotent) and write every minute held, the current one too."""
        self.stopping.set()
        task, self._task = self._task, None
        if task is None:
            return
        await asyncio.wait({task}, timeout=_STOP_GRACE_S)
        # Stuck on a database that does not answer: cancel (held rows stay pending).
        for step in (task, self._attempt):
            if step is not None and not step.done():
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await step
        fleet_task, self._fleet_task = self._fleet_task, None
        if fleet_task is not None:
            await asyncio.wait({fleet_task}, timeout=_STOP_GRACE_S)
            fleet_task.cancel()
        await self.write_rollups(until_time=self.clock() + 60.0)
        if self.ingestor.wal is not None:
            self.ingestor.wal.close()
        if self.ingestor.fleet is not None:
            await asyncio.to_thread(self.ingestor.fleet.close)
        if self._registry is not None:
            # The app may start again (tests, embedders): its registry must not keep us.
            for collector in self._collectors:
                self._registry.unregister(collector)

    # -- SLO set ----------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        """Whether the SLO set was loaded from the database (it stays loaded: a later
        outage keeps the last set)."""
        return self._loaded

    @property
    def load_error(self) -> str | None:
        """Why the SLO set is not loaded yet (``None`` once it is, or before any attempt)."""
        return None if self._loaded else self._load_error

    async def ensure_loaded(self) -> bool:
        """Whether the SLO set is loaded, trying once now if it is not (no retry, never
        raises; :attr:`load_error` says why it failed). Routes that need the SLO set call
        it, so a database that just came back serves at once, not at the loop's next try."""
        if self._loaded:
            return True
        attempt = self._attempt
        if attempt is None or attempt.done():
            attempt = self._attempt = asyncio.ensure_future(self._attempt_load())
        # Concurrent callers share one attempt; a caller that goes away never cancels it
        # (an attempt cut between the engine's update and its bookkeeping could load an
        # SLO's history twice).
        await asyncio.shield(attempt)
        return self._loaded

    async def refresh_slos(self, *, force: bool = False) -> bool:
        """Reload the SLO set if the ``slo`` table changed (always with ``force``); load
        the history of SLOs new to the engine. Returns whether the set was reloaded.
        Database errors propagate, with the engine unchanged."""
        async with self._reload_lock:
            return await self._refresh_locked(force)

    def spec(self, slo_id: str) -> SLOSpec | None:
        """The spec the engine holds for ``slo_id`` (``None`` when it has none)."""
        return next((s for s in self.engine.slos if s.id == slo_id), None)

    async def _attempt_load(self) -> None:
        """One load attempt: a failure is counted, logged once per outage and kept in
        :attr:`load_error`."""
        try:
            async with self._reload_lock:
                if self._loaded:  # a refresh_slos call got there first
                    return
                await self._refresh_locked(force=True)
        except Exception as exc:  # any database failure: stay empty, retry later
            self._counts["load_failures"] += 1
            reason = describe_error(exc)
            if self._load_error is None:
                logger.warning(
                    "goodput engine cannot load the SLO set (%s); it serves no SLO and "
                    "refuses ingest until the database answers; retrying",
                    reason,
                )
            else:
                logger.debug("goodput engine still cannot load the SLO set (%s)", reason)
            self._load_error = reason

    def _slo_cache(self) -> SLOCache | None:
        """The SLO cache of this runtime's database (``None``: sessions bound to no engine)."""
        bind = self.sessions.kw.get("bind")
        if not isinstance(bind, AsyncEngine | Engine):
            return None
        return slo_cache(bind, ttl_s=self.settings.slo_cache_ttl_s)

    def _fill_slo_cache(self, cache: SLOCache | None, generation: int, read_at: float) -> None:
        """Store the engine's SLO set, which the database confirmed in the read begun at
        ``read_at``, in the SLO cache (``controlplane.services.slos_cache``)."""
        if cache is None:
            return
        slos = [
            CachedSLO(uuid.UUID(s.id), s.name, s.version, s.selector.get("tenant"))
            for s in self.engine.slos
        ]
        cache.fill(slos, generation, read_at)

    async def _refresh_locked(self, force: bool) -> bool:
        cache = self._slo_cache()
        generation, read_at = (0, 0.0) if cache is None else (cache.generation, cache.clock())
        async with self.sessions() as session:
            fingerprint = await slo_service.slo_set_fingerprint(session)
            if not force and fingerprint == self._fingerprint:
                # The engine's set is the database's as of this read.
                self._fill_slo_cache(cache, generation, read_at)
                return False
            specs = await slo_service.live_specs(session)
            known = {s.id for s in self.engine.slos}
            added = [s for s in specs if s.id not in known]
            # History before any change: a failed read leaves the engine as it was, so the
            # next attempt loads the same SLOs whole (never a set without its history, whose
            # first upsert would overwrite the stored minutes with smaller counts).
            history = await rollup_service.history(session, added, now=self.clock())
        checkpoint = await self._checkpoint() if self._needs_wal() else None
        self._counts["loaded"] += await asyncio.to_thread(self._install, specs, history)
        if self.settings.fleet_ingest and self.ingestor.fleet is None:
            await self._open_fleet_log()
        if checkpoint is not None:  # first load: the log's replay before any ingest
            try:
                await asyncio.to_thread(self._open_wal, checkpoint)
            except WalError as exc:
                if self.settings.wal_dir:  # a folder set on purpose: a load failure
                    raise
                # The default folder is another live process's (on this database and
                # host): serve everything but ingest, and take the log over once it is
                # free (its owner gone: its acknowledged records are replayed here).
                if self.ingestor.refusal is None:
                    logger.error("ingest refused: %s", exc)
                self.ingestor.refusal = f"{exc}; ingest goes to the process that owns it"
        self._fingerprint = fingerprint
        self._fill_slo_cache(cache, generation, read_at)
        self._counts["reloads"] += 1
        if not self._loaded and self._load_error is not None:
            logger.warning("goodput engine loaded the SLO set: the database answers again")
        self._loaded, self._load_error = True, None
        logger.info("goodput engine has %d SLO(s) (%d new)", len(specs), len(added))
        return True

    def _needs_wal(self) -> bool:
        return (
            not self.settings.fleet_ingest
            and self.ingestor.wal is None
            and self.settings.wal_path() is not None
        )

    # -- the fleet log ------------------------------------------------------------------------

    async def _open_fleet_log(self) -> None:
        """Catch up with the fleet log from the checkpoint the stored rollups were written
        with, then take ingest and read on (:meth:`read_fleet_log`)."""
        async with self.sessions() as session:
            row = await rollup_service.checkpoint(session, rollup_service.FLEET_CHECKPOINT)
        covered = (0, 0) if row is None else (row.segment, row.covered_until_minute)
        replica = self.replica_id
        log = await asyncio.to_thread(FleetLog, self.settings.database_url, replica)
        if row is not None:
            self.ingestor.dedup.restore(bytes(row.dedup))
        self._fleet_covered = covered
        records = await self._catch_up(log)
        self._counts["wal_replayed_records"] += records
        loop = asyncio.get_running_loop()

        def committed() -> None:  # the writer thread's, after each commit
            with contextlib.suppress(RuntimeError):  # the loop closed: the replica stopped
                loop.call_soon_threadsafe(self._fleet_committed.set)

        log.on_commit = committed
        self.ingestor.fleet = log
        logger.info(
            "fleet ingest log: %s caught up to transaction %d (%d records past the checkpoint)",
            replica,
            self.ingestor.fleet_cursor,
            records,
        )
        self._fleet_task = asyncio.create_task(self._read_fleet_loop(), name="goodput-fleet-log")

    @property
    def replica_id(self) -> str:
        return self.settings.replica_id or default_replica_id()

    async def read_fleet_log(self) -> int:
        """Apply what the fleet log holds past this replica's cursor; records applied."""
        log = self.ingestor.fleet
        return 0 if log is None else await self._catch_up(log)

    async def _catch_up(self, log: FleetLog) -> int:
        """Apply ``log``'s rows past the cursor until none is left; records applied."""
        records = 0
        while rows := await asyncio.to_thread(log.read, self.ingestor.fleet_cursor):
            records += await asyncio.to_thread(
                self.ingestor.apply_rows, rows, covered=self._fleet_covered
            )
        return records

    async def _read_fleet_loop(self) -> None:
        interval_s = self.settings.fleet_read_interval_s
        failing = False
        while not self.stopping.is_set():
            self._fleet_committed.clear()  # a commit from here on wakes the next wait
            try:
                await self.read_fleet_log()
            except Exception as exc:  # the database is away: read on when it is back
                if not failing:
                    logger.warning("reading the fleet ingest log failed (%s)", describe_error(exc))
                failing = True
            else:
                failing = False
            # The next poll (the other replicas' rows), or at once when this replica
            # committed rows: its own batches are counted without waiting for the poll.
            wakers = {
                asyncio.ensure_future(self.stopping.wait()),
                asyncio.ensure_future(self._fleet_committed.wait()),
            }
            try:
                await asyncio.wait(wakers, timeout=interval_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waker in wakers:
                    waker.cancel()

    async def _checkpoint(self) -> WalCheckpointState:
        """The log's checkpoint from the database; on a fresh database a new epoch, saved
        before anything is logged under it."""
        async with self.sessions() as session, session.begin():
            row = await rollup_service.checkpoint(session)
            if row is None:
                epoch = uuid.uuid4().hex
                await rollup_service.save_checkpoint(
                    session, epoch=epoch, segment=-1, covered_until_minute=0, dedup=b""
                )
                return WalCheckpointState(epoch, -1, 0, b"")
            return WalCheckpointState(
                row.epoch, row.segment, row.covered_until_minute, bytes(row.dedup)
            )

    def _open_wal(self, checkpoint: WalCheckpointState) -> None:
        path = self.settings.wal_path()
        assert path is not None
        wal = WriteAheadLog(path, checkpoint.epoch, fsync=self.settings.wal_fsync)
        stats = replay(
            self.ingestor,
            wal,
            segment=checkpoint.segment,
            covered_until_minute=checkpoint.covered_until_minute,
            dedup=checkpoint.dedup,
        )
        self._counts["wal_replayed_records"] += stats.num_records
        self.ingestor.wal, self.ingestor.refusal = wal, None

    def _install(self, specs: list[SLOSpec], history: list[MinuteRollup]) -> int:
        """The new set and its new SLOs' history, in one worker-thread step."""
        self.engine.set_slos(specs)
        return self.engine.load_rollups(history) if history else 0

    # -- rollups ----------------------------------------------------------------------------

    async def write_rollups(self, until_time: float | None = None) -> int:
        """Upsert the minutes complete by ``until_time`` (default now) that are new or
        changed, plus any left from a failed write, in one transaction. Returns the rows
        written; on a database error keeps them for the next call and returns 0."""
        until = self.clock() if until_time is None else until_time
        wal = self.ingestor.wal
        fleet = self.ingestor.fleet
        cut = await asyncio.to_thread(self.ingestor.cut, until)
        if fleet is not None:  # the leader writes for every replica: they count alike
            leadership = self.leadership
            leading = leadership is not None and leadership.is_leader()
            if not leading:
                self._was_leading = False
                self._pending.clear()
                return 0
            if not self._was_leading:  # what the last leader may not have written
                self._was_leading = True
                since = self._fleet_covered[1] * 60 if self._fleet_covered else until - 7200
                for rollup in self.engine.reemit_rollups(since, until):
                    self._pending[(rollup.slo_id, rollup.minute_start)] = rollup
        for rollup in cut.rollups:
            self._pending[(rollup.slo_id, rollup.minute_start)] = rollup
        # An SLO deleted since: its rows would fail the whole write (foreign key) forever.
        live_ids = {spec.id for spec in self.engine.slos}
        for key in [k for k in self._pending if k[0] not in live_ids]:
            del self._pending[key]
        self._trim_pending()
        if not self._pending and wal is None and fleet is None:
            return 0
        covered_until_minute = math.floor(until) // 60
        try:
            async with self.sessions() as session, session.begin():
                if fleet is not None and self.leadership is not None:
                    await self.leadership.fence(session)  # a deposed leader writes nothing
                written = await rollup_service.upsert(session, self._pending.values())
                if fleet is not None:  # the rollups and the fleet log's rows they cover
                    await rollup_service.save_checkpoint(
                        session,
                        epoch=FLEET_EPOCH,
                        segment=cut.segment,
                        covered_until_minute=covered_until_minute,
                        dedup=cut.dedup,
                        row_id=rollup_service.FLEET_CHECKPOINT,
                    )
                elif wal is not None:  # the same transaction: the rollups and what they cover
                    await rollup_service.save_checkpoint(
                        session,
                        epoch=wal.epoch,
                        segment=cut.segment,
                        covered_until_minute=covered_until_minute,
                        dedup=cut.dedup,
                    )
        except Exception as exc:  # any database failure: keep the rows, retry next time
            self._counts["write_failures"] += 1
            if not self._failing:
                logger.warning(
                    "writing %d goodput rollup(s) failed (%s); will retry",
                    len(self._pending),
                    describe_error(exc),
                )
            self._failing = True
            return 0
        if self._failing:
            logger.warning("goodput rollups written again (%d rows)", written)
        self._failing = False
        self._pending.clear()
        self._counts["rollups_written"] += written
        if wal is not None:
            released = wal.release(cut.segment, covered_until_minute)
            self._counts["wal_segments_released"] += released
        if fleet is not None:
            self._fleet_covered = (cut.segment, covered_until_minute)
            try:
                released = await asyncio.to_thread(fleet.release, cut.segment, covered_until_minute)
            except Exception as exc:  # the next checkpoint deletes them
                logger.warning("releasing fleet log rows failed (%s)", describe_error(exc))
            else:
                self._counts["fleet_rows_released"] += released
        return written

    def _trim_pending(self) -> None:
        excess = len(self._pending) - MAX_PENDING_ROLLUPS
        if excess > 0:
            for key in sorted(self._pending, key=lambda k: k[1])[:excess]:
                del self._pending[key]
            self._counts["rollups_dropped"] += excess

    # -- the loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self.ensure_loaded()
        finally:
            self._first_attempt.set()
        retry_s = min(_RETRY_INITIAL_S, self.settings.database_retry_max_s)
        while not self.stopping.is_set():
            wait_s = self.settings.slo_poll_interval_s if self._loaded else retry_s
            try:
                await asyncio.wait_for(self.stopping.wait(), timeout=wait_s)
                return
            except TimeoutError:
                pass
            if not await self.ensure_loaded():
                retry_s = min(retry_s * 2, self.settings.database_retry_max_s)
                continue
            await self.tick()

    async def tick(self) -> None:
        """One loop step: reload SLOs if they changed; write rollups when due."""
        try:
            await self.refresh_slos()
        except Exception as exc:  # the database may be away: keep the last SLO set
            if not self._poll_failing:
                logger.warning(
                    "polling the SLO table failed (%s); keeping the current SLO set",
                    describe_error(exc),
                )
            self._poll_failing = True
        else:
            if self._poll_failing:
                logger.warning("polling the SLO table works again")
            self._poll_failing = False
        now = self.clock()
        if now >= self._next_rollup_at:
            self._next_rollup_at = now + self.settings.rollup_interval_s
            await self.write_rollups(now)

    def counts(self) -> dict[str, int]:
        """Runtime counters (reloads, rollups written/dropped/loaded/pending, write and
        load failures) and ``slo_set_loaded`` (1 or 0)."""
        wal = self.ingestor.wal
        return {
            **self._counts,
            "rollups_pending": len(self._pending),
            "slo_set_loaded": int(self._loaded),
            "wal_syncs": wal.num_syncs if wal is not None else 0,
            "wal_segments": len(wal.segments) if wal is not None else 0,
        }


# (type, name, help, key of LiveGoodput.counts()) of the runtime's unlabelled families.
_FAMILIES: tuple[tuple[type[CounterMetricFamily | GaugeMetricFamily], str, str, str], ...] = (
    (CounterMetricFamily, "goodput_rollup_write_failures",
     "Rollup writes the database refused (rows kept for retry).", "write_failures"),
    (GaugeMetricFamily, "goodput_rollup_rows_pending",
     "Rollup rows waiting for a successful write.", "rollups_pending"),
    (GaugeMetricFamily, "goodput_slo_set_loaded",
     "1 once the engine loaded the SLO set from the database; 0 while it retries.",
     "slo_set_loaded"),
    (CounterMetricFamily, "goodput_slo_load_failures",
     "Attempts to load the SLO set that failed (database down or not migrated).",
     "load_failures"),
    (CounterMetricFamily, "goodput_wal_replayed_records",
     "Records the ingest write-ahead log gave back to the engine at start.",
     "wal_replayed_records"),
    (CounterMetricFamily, "goodput_wal_syncs",
     "fsync calls of the ingest write-ahead log (one covers concurrent batches).", "wal_syncs"),
    (GaugeMetricFamily, "goodput_wal_segments",
     "Write-ahead log segments on disk (released once a checkpoint covers them).",
     "wal_segments"),
)  # fmt: skip


class _LeaderOnly:
    """The engine's SLO series, from the leader alone when replicas share ingest: every
    replica counts the whole fleet, so N replicas scraped would export N copies of each
    series (N times the rates in a ``sum``, and the rules' ``group_left`` joins on
    ``goodput_slo_info`` would match N series). Without the fleet log, every replica."""

    def __init__(self, inner: Collector, live: LiveGoodput) -> None:
        self._inner = inner
        self._live = live

    def collect(self) -> Iterator[Metric]:
        live = self._live
        if live.settings.fleet_ingest:
            leadership = live.leadership
            if leadership is None or not leadership.is_leader():
                return iter(())
        return iter(self._inner.collect())


class _RuntimeCollector:
    """``goodput_rollup_*`` and ``goodput_slo_*`` from the runtime's counters."""

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
        for family, name, doc, key in _FAMILIES:
            yield family(name, doc, value=counts[key])
        ingestor = self._live.ingestor
        fleet = ingestor.fleet
        if fleet is None:
            return
        rows = CounterMetricFamily(
            "goodput_fleet_log_rows",
            "Fleet log rows this replica read: applied, or duplicate (a batch counted before).",
            labels=["outcome"],
        )
        for outcome, value in ingestor.fleet_rows.items():
            rows.add_metric([outcome], value)
        yield rows
        yield CounterMetricFamily(
            "goodput_fleet_log_appended_rows",
            "Batches this replica appended to the fleet log (acknowledged once committed).",
            value=fleet.num_rows_appended,
        )
        yield CounterMetricFamily(
            "goodput_fleet_log_commit_failures",
            "Fleet log commits that failed (their batches answered 503, resent).",
            value=fleet.num_commit_failures,
        )
        yield CounterMetricFamily(
            "goodput_fleet_log_released_rows",
            "Fleet log rows deleted once a checkpoint covered them (by this replica, leading).",
            value=counts["fleet_rows_released"],
        )
        yield GaugeMetricFamily(
            "goodput_fleet_log_cursor",
            "The last fleet log transaction id this replica applied.",
            value=ingestor.fleet_cursor,
        )


def app_registry() -> CollectorRegistry:
    """A registry of the app's own (process and platform metrics, the commands counted by
    :mod:`controlplane.runtime.loop_metrics`; never the global one)."""
    from controlplane.runtime.loop_metrics import command_collector

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(command_collector())
    return registry
