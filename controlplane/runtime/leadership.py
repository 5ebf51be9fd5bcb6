"""Which control-plane replica runs the control loops: a lease in the database, fenced.

Replicas that share a database elect one leader for the admission and planner loops (the
``loops`` row of ``leader_lease``). Every ``ttl_s / 3`` each replica runs one conditional
write: the holder extends its lease; any replica takes an expired lease, and taking it adds
one to ``epoch``, the fencing token. A replica is leader while it holds the lease by its own
clock, minus a safety margin. Ingest, queries and the admin API run on every replica; only
the loops wait for the lease.

**Fencing.** Leadership by the clock is not enough: a leader paused (GC, a stopped VM, a slow
disk) past its lease can wake up in the middle of a tick and write commands after another
replica took over. So every loop transaction begins with :meth:`Leadership.fence`: it reads
the lease row ``FOR UPDATE`` and raises :class:`DeposedError` unless this replica still holds
the epoch it acquired. On PostgreSQL the row lock orders the fence against the takeover
(the taker's write waits for the tick's commit, or the tick's fence sees the new epoch), so
a deposed leader's late writes are refused, never interleaved. Replicas need PostgreSQL:
on SQLite (one process, the embedded default) the app runs its loops without a lease.

**Liveness** needs the replicas' clocks within a fraction of ``ttl_s`` of each other (NTP);
safety does not (the fence compares epochs, not times). A leader that stops cleanly
releases the lease (its ``expires_at`` set to now), so the next one takes over at its next
renewal instead of after the TTL. With the defaults (``ttl_s`` 6 s, renewal every 2 s) a
killed leader is replaced within 8 s.

Example::

    leadership = Leadership(sessions, replica_id="cp-0", ttl_s=6.0)
    await leadership.renew()          # True: this replica leads (epoch 1)
    async with sessions() as session, session.begin():
        await leadership.fence(session)  # DeposedError once another replica took over
        ...                               # the loop's writes
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from fastapi import FastAPI
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.errors import describe_error
from controlplane.models.leader_lease import LeaderLease

__all__ = [
    "LOOPS_LEASE",
    "DeposedError",
    "Leadership",
    "LeadershipCollector",
    "default_replica_id",
    "leadership_lifespan",
]

logger = logging.getLogger(__name__)

LOOPS_LEASE = "loops"
#: The share of the TTL a leader keeps in hand: it stops acting this long before its lease
#: expires by its own clock, so a slightly fast clock elsewhere does not see two leaders.
_SAFETY_RATIO = 0.2


class DeposedError(RuntimeError):
    """This replica no longer holds the epoch it acted under: its transaction must not
    commit."""


def default_replica_id() -> str:
    """``host:pid``: unique among replicas on one machine or one cluster."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Leadership:
    """This replica's view of the ``name`` lease (see the module docstring)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        replica_id: str,
        ttl_s: float = 6.0,
        name: str = LOOPS_LEASE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        self.sessions = sessions
        self.replica_id = replica_id
        self.ttl_s = ttl_s
        self.name = name
        self.clock = clock
        self.epoch: int | None = None  # the epoch this replica holds, if any
        self._valid_until = 0.0  # by this replica's clock
        self.num_acquired = 0
        self.num_renew_failures = 0
        self._failing = False

    @property
    def renew_interval_s(self) -> float:
        return self.ttl_s / 3

    def is_leader(self) -> bool:
        """Whether this replica holds the lease now, by its own clock, with the margin."""
        return self.epoch is not None and self.clock() < self._valid_until

    async def renew(self) -> bool:
        """Extend the lease held, or take it when it is free or expired; whether this
        replica leads now. A database error counts as not leading (and is logged once per
        streak): a replica that cannot reach the database must not act."""
        started = self.clock()
        try:
            epoch = await self._write(started)
        except Exception as exc:  # the database is away: stop acting until it is back
            self.num_renew_failures += 1
            if not self._failing:
                logger.warning(
                    "leader lease %r: renewal failed (%s)", self.name, describe_error(exc)
                )
            self._failing = True
            self.epoch = None
            return False
        self._failing = False
        if epoch is not None and epoch != self.epoch:
            self.num_acquired += 1
            logger.warning(
                "leader lease %r: %s leads (epoch %d)", self.name, self.replica_id, epoch
            )
        elif epoch is None and self.epoch is not None:
            logger.warning("leader lease %r: %s no longer leads", self.name, self.replica_id)
        self.epoch = epoch
        # Counted from before the write: the lease in the database runs from later than that.
        self._valid_until = started + self.ttl_s * (1 - _SAFETY_RATIO)
        return epoch is not None

    async def _write(self, now_s: float) -> int | None:
        now = datetime.fromtimestamp(now_s, UTC)
        expires = now + timedelta(seconds=self.ttl_s)
        async with self.sessions() as session, session.begin():
            taken = await session.execute(
                sa.update(LeaderLease)
                .where(
                    LeaderLease.name == self.name,
                    sa.or_(LeaderLease.holder == self.replica_id, LeaderLease.expires_at <= now),
                )
                .values(
                    holder=self.replica_id,
                    expires_at=expires,
                    epoch=sa.case(
                        (LeaderLease.holder == self.replica_id, LeaderLease.epoch),
                        else_=LeaderLease.epoch + 1,
                    ),
                    acquired_at=sa.case(
                        (LeaderLease.holder == self.replica_id, LeaderLease.acquired_at), else_=now
                    ),
                )
                .returning(LeaderLease.epoch)
            )
            epoch = taken.scalar_one_or_none()
            if epoch is not None:
                return int(epoch)
            exists = await session.scalar(
                sa.select(LeaderLease.epoch).where(LeaderLease.name == self.name)
            )
            if exists is not None:
                return None  # another replica holds it
        # No row yet: the first replica to insert it leads (epoch 1); a racing one loses.
        try:
            async with self.sessions() as session, session.begin():
                session.add(
                    LeaderLease(
                        name=self.name,
                        holder=self.replica_id,
                        epoch=1,
                        expires_at=expires,
                        acquired_at=now,
                    )
                )
        except IntegrityError:
            return None
        return 1

    async def fence(self, session: AsyncSession) -> int:
        """Lock the lease row in ``session``'s transaction and check this replica still
        holds its epoch; the epoch, or :class:`DeposedError`."""
        if self.epoch is None:
            raise DeposedError(f"{self.replica_id} does not hold the {self.name!r} lease")
        row = (
            await session.execute(
                sa.select(LeaderLease.holder, LeaderLease.epoch)
                .where(LeaderLease.name == self.name)
                .with_for_update()
            )
        ).one_or_none()
        mine = self.epoch
        if row is None or row.holder != self.replica_id or row.epoch != mine:
            held = "nobody" if row is None else f"{row.holder} (epoch {row.epoch})"
            self.epoch = None
            raise DeposedError(
                f"{self.replica_id} acted under epoch {mine} of {self.name!r}, now held by {held}"
            )
        return mine

    async def release(self) -> None:
        """End the lease now (a clean stop), so that another replica takes over at once."""
        epoch, self.epoch = self.epoch, None
        if epoch is None:
            return
        now = datetime.fromtimestamp(self.clock(), UTC)
        with contextlib.suppress(Exception):  # best effort: the lease expires anyway
            async with self.sessions() as session, session.begin():
                await session.execute(
                    sa.update(LeaderLease)
                    .where(
                        LeaderLease.name == self.name,
                        LeaderLease.holder == self.replica_id,
                        LeaderLease.epoch == epoch,
                    )
                    .values(expires_at=now)
                )

    async def run(self, stopping: asyncio.Event) -> None:
        """Renew every :attr:`renew_interval_s` until ``stopping`` is set."""
        while not stopping.is_set():
            await self.renew()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=self.renew_interval_s)


class LeadershipCollector(Collector):
    """``goodput_leader`` (1 while this replica leads the loops, else 0, labelled with its
    ``replica``), ``goodput_leader_epoch`` (the epoch it holds; absent while it follows),
    and ``goodput_leader_acquired_total`` (how often it took the lease)."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership

    def collect(self) -> Iterator[Metric]:
        lead = self.leadership
        leader = GaugeMetricFamily(
            "goodput_leader", "1 while this replica runs the control loops.", labels=["replica"]
        )
        leader.add_metric([lead.replica_id], 1.0 if lead.is_leader() else 0.0)
        yield leader
        if lead.epoch is not None:
            yield GaugeMetricFamily(
                "goodput_leader_epoch",
                "The fencing epoch of the lease this replica holds.",
                value=lead.epoch,
            )
        yield CounterMetricFamily(
            "goodput_leader_acquired",
            "Times this replica took the loops' lease.",
            value=lead.num_acquired,
        )


@asynccontextmanager
async def leadership_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """``app.state.leadership``: the replica's lease on the loops, renewed while the app
    runs (the first renewal before the loops start, so that a lone replica leads from its
    first tick) and released when it stops; ``None`` when no loop is enabled (and ingest
    is not shared through the fleet log) or the database is SQLite."""
    settings = app.state.settings
    loops = settings.planner_enabled or settings.admission_enabled
    leads = loops or settings.fleet_ingest  # the fleet log's rollups have one writer too
    if not leads or settings.database_url.startswith("sqlite"):
        # No loop to lead, or SQLite: one process, whose loops always run. A lease renewed
        # every few seconds there would be one more writer, and a read-then-write
        # transaction in WAL mode fails at once ("database is locked") when another
        # writer committed since its read.
        app.state.leadership = None
        yield
        return
    leadership = Leadership(
        app.state.sessions,
        replica_id=settings.replica_id or default_replica_id(),
        ttl_s=settings.leader_lease_ttl_s,
    )
    app.state.leadership = leadership
    live = getattr(app.state, "live", None)
    if live is not None:
        live.leadership = leadership
    registry = getattr(app.state, "metrics_registry", None)
    collector = LeadershipCollector(leadership)
    if registry is not None:
        registry.register(collector)
    await leadership.renew()
    stopping = asyncio.Event()
    task = asyncio.create_task(leadership.run(stopping), name="goodput-leadership")
    try:
        yield
    finally:
        stopping.set()
        await task
        await leadership.release()
        if registry is not None:
            registry.unregister(collector)
