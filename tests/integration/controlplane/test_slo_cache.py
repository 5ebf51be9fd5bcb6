"""Goodput queries and the SLO cache, two replicas on one database (SQLite and PostgreSQL):
a busy query reads no SLO row, nor a replica's first query once its SLO poll has run, a
change made through one replica is answered by the other within ``slo_cache_ttl_s``
(sooner when the background read has run), a write through a replica applies to its own
queries at once, and a tenant's key never sees another tenant's cached SLO."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from controlplane.db import utcnow
from controlplane.main import create_app
from controlplane.models import KeyRole
from controlplane.services import keys as key_service
from controlplane.services.slos_cache import SLOCache, slo_cache
from controlplane.settings import Settings
from tests.integration.controlplane.conftest import bearer, empty_tables

pytestmark = pytest.mark.integration

TTL_S = 1.0
SLO = {"name": "chat", "objectives": [{"metric": "ttft", "threshold_s": 1}], "target": 0.9}
SLO_READ = re.compile(r"^SELECT .* FROM slo( |$)")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Replica:
    def __init__(self, app: FastAPI, http: httpx.AsyncClient) -> None:
        self.app, self.http = app, http
        self.clock = Clock()
        self.cache: SLOCache = slo_cache(app.state.engine, ttl_s=TTL_S)
        self.cache.clock = self.clock

    async def goodput(self, ref: str, key: str) -> httpx.Response:
        return await self.http.get(
            f"/api/v1/slos/{ref}/goodput", params={"window": "5m"}, headers=bearer(key)
        )

    async def settle(self) -> None:
        """Wait for the cache's background reads."""
        while self.cache._refreshing:
            await asyncio.sleep(0.01)


@asynccontextmanager
async def replicas(database_url: str) -> AsyncIterator[tuple[Replica, Replica]]:
    """Two control planes on one database; the SLO poll is off (an hour), so what a replica
    answers about a changed SLO comes from its queries alone."""
    settings = Settings(
        database_url=database_url, durable_ingest=False, slo_poll_interval_s=3600,
        slo_cache_ttl_s=TTL_S, planner_enabled=False, admission_enabled=False,
    )  # fmt: skip
    async with AsyncExitStack() as stack:
        pair = []
        for _ in range(2):
            app = create_app(settings)
            await stack.enter_async_context(app.router.lifespan_context(app))
            transport = httpx.ASGITransport(app=app)
            http = httpx.AsyncClient(transport=transport, base_url="http://testserver")
            pair.append(Replica(app, await stack.enter_async_context(http)))
        try:
            yield pair[0], pair[1]
        finally:
            await empty_tables(pair[0].app)


async def make_key(app: FastAPI, role: KeyRole, tenant: str | None = None) -> str:
    async with app.state.sessions() as session, session.begin():
        _, secret = await key_service.create_key(
            session, name=f"k-{role.value}", role=role, tenant=tenant, actor="cli", now=utcnow()
        )
    return secret


@contextmanager
def slo_reads(app: FastAPI) -> Iterator[list[str]]:
    """The ``slo`` table reads the app's database engine runs inside the block."""
    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        text = " ".join(statement.split())
        if SLO_READ.match(text):
            seen.append(text)

    engine = app.state.engine.sync_engine
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


async def test_a_busy_query_reads_no_slo_row(database_url: str) -> None:
    async with replicas(database_url) as (a, b):
        key = await make_key(a.app, KeyRole.OPERATOR)
        assert (await a.http.post("/api/v1/slos", json=SLO, headers=bearer(key))).is_success
        assert (await b.goodput("chat", key)).status_code == 200
        with slo_reads(b.app) as seen:
            for _ in range(5):
                response = await b.goodput("chat", key)
                assert response.status_code == 200
                assert response.json()["slo_name"] == "chat"
        assert seen == []


async def test_after_the_slo_poll_a_first_query_reads_no_slo_row(database_url: str) -> None:
    async with replicas(database_url) as (a, b):
        key = await make_key(a.app, KeyRole.OPERATOR)
        created = await a.http.post("/api/v1/slos", json=SLO, headers=bearer(key))
        assert created.is_success
        assert await b.app.state.live.refresh_slos()  # the poll's step: the new SLO seen
        with slo_reads(b.app) as seen:
            for ref in ("chat", created.json()["id"]):
                response = await b.goodput(ref, key)
                assert response.status_code == 200
                assert response.json()["slo_name"] == "chat"
        assert seen == []
        b.clock.now += TTL_S  # the poll's entries are served no longer than the TTL
        with slo_reads(b.app) as seen:
            assert (await b.goodput("chat", key)).status_code == 200
        assert len(seen) == 1


async def test_a_change_through_another_replica_is_answered_within_the_ttl(
    database_url: str,
) -> None:
    async with replicas(database_url) as (a, b):
        key = await make_key(a.app, KeyRole.OPERATOR)
        created = await a.http.post("/api/v1/slos", json=SLO, headers=bearer(key))
        assert (await b.goodput("chat", key)).status_code == 200
        renamed = await a.http.patch(
            "/api/v1/slos/chat", json={"name": "chat2"}, headers=bearer(key)
        )
        assert renamed.status_code == 200
        # The old name may be answered from B's cache until the TTL, never after.
        b.clock.now += TTL_S * 0.4
        assert (await b.goodput("chat", key)).status_code == 200
        b.clock.now += TTL_S * 0.6
        response = await b.goodput("chat", key)
        assert response.status_code == 404
        assert response.json() == {"detail": "SLO with name 'chat' not found"}
        # The new name was never cached on B: found at once, with the engine reloaded.
        response = await b.goodput("chat2", key)
        assert response.status_code == 200
        assert response.json()["slo_name"] == "chat2"
        # By id, after a deletion on A: the background read past half the TTL sees it.
        slo_id = created.json()["id"]
        assert (await b.goodput(slo_id, key)).status_code == 200
        deleted = await a.http.delete(f"/api/v1/slos/{slo_id}", headers=bearer(key))
        assert deleted.status_code == 204
        b.clock.now += TTL_S * 0.5
        assert (await b.goodput(slo_id, key)).status_code == 200  # served; read started
        await b.settle()
        assert (await b.goodput(slo_id, key)).status_code == 404


async def test_a_write_through_a_replica_applies_to_its_queries_at_once(
    database_url: str,
) -> None:
    async with replicas(database_url) as (_, b):
        key = await make_key(b.app, KeyRole.OPERATOR)
        created = await b.http.post("/api/v1/slos", json=SLO, headers=bearer(key))
        slo_id = created.json()["id"]
        assert (await b.goodput("chat", key)).status_code == 200
        changed = {"objectives": [{"metric": "ttft", "threshold_s": 2}]}
        updated = await b.http.patch("/api/v1/slos/chat", json=changed, headers=bearer(key))
        assert updated.json()["version"] == 2
        assert (await b.goodput("chat", key)).status_code == 200
        spec = b.app.state.live.spec(slo_id)
        assert spec is not None
        assert spec.version == 2  # the engine answers with the new definition
        assert (await b.http.delete("/api/v1/slos/chat", headers=bearer(key))).status_code == 204
        assert (await b.goodput("chat", key)).status_code == 404


async def test_a_cached_slo_stays_out_of_another_tenants_reach(database_url: str) -> None:
    async with replicas(database_url) as (a, _):
        admin = await make_key(a.app, KeyRole.ADMIN)
        body = {**SLO, "selector": {"tenant": "t1"}}
        assert (await a.http.post("/api/v1/slos", json=body, headers=bearer(admin))).is_success
        t1 = await make_key(a.app, KeyRole.VIEWER, tenant="t1")
        t2 = await make_key(a.app, KeyRole.VIEWER, tenant="t2")
        assert (await a.goodput("chat", t1)).status_code == 200  # cached now
        response = await a.goodput("chat", t2)
        assert response.status_code == 404
        assert response.json() == {"detail": "SLO with name 'chat' not found"}
