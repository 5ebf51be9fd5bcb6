"""Pooled connections that the server dropped (PostgreSQL): without a ping per checkout,
the statement that meets a dropped connection fails with a disconnect error, SQLAlchemy
discards every connection pooled before it, and the next session works, with no outage
of its own."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from controlplane.db import create_engine_for, session_factory
from tests.integration.controlplane.conftest import PG_URL, _libpq_dsn

pytestmark = pytest.mark.integration


async def test_a_dropped_connection_fails_one_statement_and_the_pool_recovers(
    postgresql_url: str,
) -> None:
    engine = create_engine_for(postgresql_url, echo=False)
    sessions = session_factory(engine)
    try:
        pids = set()
        async with sessions() as first, sessions() as second:  # two pooled connections
            for session in (first, second):
                pids.add(await session.scalar(sa.text("SELECT pg_backend_pid()")))
        assert len(pids) == 2
        with psycopg.connect(_libpq_dsn(PG_URL), autocommit=True) as admin:
            for pid in pids:  # what a server restart does to them
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        async with sessions() as session:
            with pytest.raises(DBAPIError) as failed:
                await session.scalar(sa.text("SELECT 1"))
        assert failed.value.connection_invalidated
        # The other dropped connection was discarded with it: both sessions work.
        async with sessions() as first, sessions() as second:
            for session in (first, second):
                assert await session.scalar(sa.text("SELECT pg_backend_pid()")) not in pids
    finally:
        await engine.dispose()
