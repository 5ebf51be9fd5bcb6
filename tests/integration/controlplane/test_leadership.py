"""The loops' leader lease on a real database: one holder at a time, takeover after the TTL
with a new epoch, a deposed leader's transaction refused by the fence, a clean release
handed over at once, and a loop that follows while another replica leads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.db import create_engine_for, session_factory
from controlplane.main import create_app
from controlplane.models import LeaderLease
from controlplane.runtime.leadership import DeposedError, Leadership
from controlplane.settings import Settings
from migrations import upgrade

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest_asyncio.fixture(loop_scope="function")
async def sessions(database_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    upgrade(database_url)
    engine = create_engine_for(database_url)
    factory = session_factory(engine)
    try:
        yield factory
    finally:
        async with engine.begin() as conn:
            await conn.execute(sa.delete(LeaderLease))
        await engine.dispose()


def held(leadership: Leadership) -> int | None:
    """The epoch held, read through a call (each renewal may change it)."""
    return leadership.epoch


def pair(sessions: async_sessionmaker[AsyncSession], clock: Clock) -> tuple[Leadership, Leadership]:
    return (
        Leadership(sessions, replica_id="a", ttl_s=6.0, clock=clock),
        Leadership(sessions, replica_id="b", ttl_s=6.0, clock=clock),
    )


async def test_one_holder_then_takeover_with_a_new_epoch(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    clock = Clock()
    a, b = pair(sessions, clock)
    assert await a.renew() and held(a) == 1 and a.is_leader()
    assert not await b.renew() and held(b) is None and not b.is_leader()
    clock.now += 3
    assert await a.renew() and held(a) == 1  # renewal keeps the epoch
    assert not await b.renew()
    # a stops renewing (killed, paused): its own clock retires it before the lease expires,
    # and b takes the lease only once it has.
    clock.now += 5
    assert not a.is_leader()
    assert not await b.renew()
    clock.now += 1.5
    assert await b.renew() and held(b) == 2 and b.is_leader()
    # a comes back: it cannot renew a lease another replica holds.
    assert not await a.renew() and held(a) is None


async def test_a_deposed_leader_cannot_commit(sessions: async_sessionmaker[AsyncSession]) -> None:
    clock = Clock()
    a, b = pair(sessions, clock)
    assert await a.renew()
    async with sessions() as session, session.begin():
        assert await a.fence(session) == 1  # a leads: its writes go through
    clock.now += 10  # a paused past its lease; b takes over
    assert await b.renew() and held(b) == 2
    a.epoch, a._valid_until = 1, clock.now + 60  # a still believes it leads (stale view)
    with pytest.raises(DeposedError, match=r"epoch 1 .* now held by b \(epoch 2\)"):
        async with sessions() as session, session.begin():
            await a.fence(session)
    assert held(a) is None and not a.is_leader()


async def test_the_fence_orders_a_takeover_after_the_leaders_transaction(
    postgresql_url: str,
) -> None:
    # Row locks: PostgreSQL (SQLite runs one writer at a time anyway).
    engine = create_engine_for(postgresql_url)
    sessions = session_factory(engine)
    try:
        clock = Clock()
        a, b = pair(sessions, clock)
        assert await a.renew()
        clock.now += 10
        async with sessions() as session, session.begin():
            await a.fence(session)  # the lease row is locked until this transaction ends
            takeover = asyncio.create_task(b.renew())
            await asyncio.sleep(0.3)
            assert not takeover.done()  # the taker waits for the leader's commit
        assert await takeover and held(b) == 2
    finally:
        async with engine.begin() as conn:
            await conn.execute(sa.delete(LeaderLease))
        await engine.dispose()


async def test_a_clean_release_hands_over_at_once(
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    clock = Clock()
    a, b = pair(sessions, clock)
    assert await a.renew()
    await a.release()
    assert not a.is_leader()
    clock.now += 0.001
    assert await b.renew() and held(b) == 2


async def test_a_database_error_means_not_leading() -> None:
    broken = session_factory(create_engine_for("postgresql+psycopg://nobody@127.0.0.1:1/none"))
    leadership = Leadership(broken, replica_id="a")
    assert not await leadership.renew()
    assert not leadership.is_leader() and leadership.num_renew_failures == 1


async def test_an_app_on_sqlite_runs_its_loops_without_a_lease(sqlite_url: str) -> None:
    app = create_app(Settings(database_url=sqlite_url))
    async with app.router.lifespan_context(app):
        assert app.state.leadership is None
        assert app.state.planner.leadership is None  # it ticks: no lease to wait for
        async with app.state.sessions() as session:
            assert await session.scalar(sa.select(sa.func.count()).select_from(LeaderLease)) == 0


async def test_an_app_on_postgresql_leads_through_the_lease(postgresql_url: str) -> None:
    app = create_app(Settings(database_url=postgresql_url))
    async with app.router.lifespan_context(app):
        leadership = app.state.leadership
        assert leadership is not None and leadership.is_leader()
        assert app.state.planner.leadership is leadership
