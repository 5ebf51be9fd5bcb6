"""The control plane starts without a database and catches up when it comes back.

The database "goes away" for real: the app reaches PostgreSQL through a TCP proxy on
loopback that is off (connection refused) and then on. The app (in its lifespan, and under
a real uvicorn server) must start, answer ``/health``, say why it is not ready, and once the
database answers load the SLO set and its stored history exactly once, whether a request or
the loop's retry gets there first; a batch refused meanwhile is applied when resent, once.
An unmigrated database (PostgreSQL and SQLite) is the same story, ended by an upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import sqlalchemy as sa
import uvicorn
from fastapi import FastAPI

from controlplane.db import create_engine_for, session_factory, sync_url, utcnow
from controlplane.main import create_app
from controlplane.models import SCHEMA_REVISION, GoodputRollup, KeyRole
from controlplane.runtime.live import LiveGoodput
from controlplane.services import keys as key_service
from controlplane.settings import Settings
from exporters.records import Labels, RecordBatch, RequestRecord, Vantage
from exporters.wire import CONTENT_TYPE_BINARY, encode_batch
from migrations import upgrade
from tests.integration.controlplane.conftest import create_schema, drop_schema, schema_url

pytestmark = pytest.mark.integration

SLO = {
    "name": "chat",
    "objectives": [{"metric": "ttft", "threshold_s": 0.5}],
    "target": 0.9,
    "window_s": 86_400,
}
NOT_MIGRATED = (
    "not ready: database schema is at revision None, this control plane needs "
    f"'{SCHEMA_REVISION}'; run `goodput db upgrade`"
)


class SwitchableDatabase:
    """A TCP proxy on loopback in front of a PostgreSQL server: off, connections to
    :attr:`url` are refused; :meth:`up` forwards them; :meth:`down` also cuts the open ones."""

    def __init__(self, database_url: str) -> None:
        target = sa.make_url(database_url)
        self._target = (target.host or "127.0.0.1", target.port or 5432)
        with socket.socket() as probe:  # a free port, refused until up()
            probe.bind(("127.0.0.1", 0))
            self.port: int = probe.getsockname()[1]
        self.url = target.set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False
        )
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def down(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        self._writers |= {writer, upstream_writer}
        try:
            await asyncio.gather(
                self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer)
            )
        finally:
            self._writers -= {writer, upstream_writer}

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65_536):
                writer.write(data)
                await writer.drain()
        writer.close()


def records(n: int, *, slow: int = 0, exporter_seq: int = 0) -> bytes:
    """``n`` finished two-token requests (``slow`` of them miss the 0.5 s TTFT objective) as
    one binary batch from exporter ``gw-0``."""
    arrival_ns = time.time_ns() - 2_000_000_000
    batch = RecordBatch.from_records(
        [
            RequestRecord(
                request_id=f"r{exporter_seq}-{k}",
                vantage=Vantage.GATEWAY,
                arrival_time_ns=arrival_ns,
                labels=Labels(model="llama"),
                emission_offsets_us=np.array([900_000 if k < slow else 100_000, 1_000_000]),
            )
            for k in range(n)
        ]
    )
    return encode_batch(batch, exporter_id="gw-0", seq=exporter_seq)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def mint_key(database_url: str, role: KeyRole) -> str:
    engine = create_engine_for(database_url)
    try:
        async with session_factory(engine)() as session, session.begin():
            _, key = await key_service.create_key(
                session,
                name=f"test-{role.value}",
                role=role,
                tenant=None,
                actor="cli",
                now=utcnow(),
            )
        return key
    finally:
        await engine.dispose()


async def stored_requests(database_url: str) -> int:
    engine = create_engine_for(database_url)
    try:
        async with engine.connect() as conn:
            total = await conn.scalar(sa.select(sa.func.sum(GoodputRollup.requests)))
        return int(total or 0)
    finally:
        await engine.dispose()


@contextlib.asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            yield app, http


async def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.fixture
def own_schema() -> Iterator[str]:
    """A PostgreSQL schema of this test's own (the proxy and the migrations need one)."""
    schema = create_schema()
    try:
        yield schema_url(schema)
    finally:
        drop_schema(schema)


@pytest.fixture
def migrated(own_schema: str) -> str:
    upgrade(own_schema)
    return own_schema


async def test_starts_without_the_database_and_loads_once_it_answers(migrated: str) -> None:
    # History: a first run that counted 7 requests (2 bad) and wrote its minute at stop.
    admin = bearer(await mint_key(migrated, KeyRole.ADMIN))
    ingest = {
        **bearer(await mint_key(migrated, KeyRole.INGEST)),
        "Content-Type": CONTENT_TYPE_BINARY,
    }
    async with running(Settings(database_url=migrated)) as (app, client):
        assert (await client.post("/api/v1/slos", json=SLO, headers=admin)).status_code == 201
        await app.state.live.refresh_slos()
        response = await client.post("/api/v1/ingest", content=records(7, slow=2), headers=ingest)
        assert response.json()["num_records"] == 7
    assert await stored_requests(migrated) == 7

    database = SwitchableDatabase(migrated)
    settings = Settings(database_url=database.url, database_retry_max_s=0.1)
    try:
        await _outage_and_return(database, settings, admin, ingest)
    finally:
        await database.down()
    # The stop wrote the minutes through the database that came back: 7 + 3, not more.
    assert await stored_requests(migrated) == 10


async def _outage_and_return(
    database: SwitchableDatabase,
    settings: Settings,
    admin: dict[str, str],
    ingest: dict[str, str],
) -> None:
    async with running(settings) as (app, client):
        live: LiveGoodput = app.state.live
        assert live.counts()["slo_set_loaded"] == 0
        assert (live.load_error or "").startswith("OperationalError: connection failed")
        health = await client.get("/health")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        ready = await client.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["detail"] == "not ready: database unreachable (OperationalError)"
        metrics = (await client.get("/metrics")).text
        assert "goodput_slo_set_loaded 0.0" in metrics
        await eventually(lambda: live.counts()["load_failures"] >= 3)  # retries, in vain

        await database.up()
        ready = await client.get("/ready")
        assert ready.status_code == 200, ready.text
        assert live.loaded and live.load_error is None
        assert [spec.name for spec in live.engine.slos] == ["chat"]
        await asyncio.sleep(0.3)  # a few loop steps later, the history still counts once
        stats = (await client.get("/api/v1/slos/chat/goodput?window=1d", headers=admin)).json()
        assert (stats["requests"], stats["good"], stats["bad"]) == (7, 5, 2)

        response = await client.post(
            "/api/v1/ingest", content=records(3, exporter_seq=1), headers=ingest
        )
        assert response.json()["num_records"] == 3
        stats = (await client.get("/api/v1/slos/chat/goodput?window=1d", headers=admin)).json()
        assert (stats["requests"], stats["good"]) == (10, 8)
        assert "goodput_slo_set_loaded 1.0" in (await client.get("/metrics")).text


@contextlib.asynccontextmanager
async def served(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app under a real uvicorn server on a loopback port."""
    app = create_app(settings)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await eventually(lambda: server.started or serving.done())
        assert server.started, "uvicorn did not start"
        base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
            yield app, http
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=10)
        sock.close()


async def test_the_server_starts_and_the_loop_loads_the_slo_set_on_its_own(
    migrated: str,
) -> None:
    admin = bearer(await mint_key(migrated, KeyRole.ADMIN))
    async with running(Settings(database_url=migrated)) as (_, client):
        assert (await client.post("/api/v1/slos", json=SLO, headers=admin)).status_code == 201
    database = SwitchableDatabase(migrated)
    settings = Settings(database_url=database.url, database_retry_max_s=0.1)
    try:
        async with served(settings) as (app, http):
            live: LiveGoodput = app.state.live
            assert live.counts()["slo_set_loaded"] == 0
            assert (await http.get("/health")).status_code == 200
            assert (await http.get("/ready")).status_code == 503
            await database.up()
            await eventually(lambda: live.loaded)  # no request asked for it
            assert [spec.name for spec in live.engine.slos] == ["chat"]
            assert (await http.get("/ready")).status_code == 200
    finally:
        await database.down()


async def test_ingest_is_refused_until_the_slo_set_loads_then_applied_once(
    migrated: str,
) -> None:
    admin = bearer(await mint_key(migrated, KeyRole.ADMIN))
    ingest = {
        **bearer(await mint_key(migrated, KeyRole.INGEST)),
        "Content-Type": CONTENT_TYPE_BINARY,
    }
    async with running(Settings(database_url=migrated)) as (_, client):
        assert (await client.post("/api/v1/slos", json=SLO, headers=admin)).status_code == 201
    # Keys answer, but the history cannot be read: the SLO set cannot load.
    sync = sa.create_engine(sync_url(migrated))
    with sync.begin() as conn:
        conn.execute(sa.text("ALTER TABLE goodput_rollup RENAME TO goodput_rollup_away"))
    settings = Settings(database_url=migrated, database_retry_max_s=60)
    try:
        async with running(settings) as (app, client):
            live: LiveGoodput = app.state.live
            body = records(4)
            refused = await client.post("/api/v1/ingest", content=body, headers=ingest)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["detail"].startswith(
                "the goodput engine has not loaded the SLO set yet (UndefinedTable: relation "
                '"goodput_rollup" does not exist'
            )
            ready = await client.get("/ready")
            assert ready.status_code == 503
            assert ready.json()["detail"] == (
                "not ready: the goodput engine has not loaded the SLO set (UndefinedTable)"
            )
            otlp = await client.post(
                "/v1/traces", content=b"", headers={**ingest, "Content-Type": "application/json"}
            )
            assert (otlp.status_code, otlp.headers["retry-after"]) == (503, "1")
            assert otlp.json()["code"] == 14  # google.rpc.Code UNAVAILABLE

            with sync.begin() as conn:
                conn.execute(sa.text("ALTER TABLE goodput_rollup_away RENAME TO goodput_rollup"))
            # The resend itself loads the set (the loop would wait up to a minute).
            resent = await client.post("/api/v1/ingest", content=body, headers=ingest)
            assert resent.status_code == 200, resent.text
            assert resent.json()["duplicate"] is False
            again = await client.post("/api/v1/ingest", content=body, headers=ingest)
            assert again.json()["duplicate"] is True
            assert live.loaded
            stats = (await client.get("/api/v1/goodput?window=1m", headers=admin)).json()
            assert [s["requests"] for s in stats["data"]] == [4]
    finally:
        sync.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_starts_on_an_unmigrated_database(
    backend: str, own_schema: str, tmp_path: Path
) -> None:
    url = own_schema if backend == "postgresql" else f"sqlite:///{tmp_path}/empty.db"
    async with running(Settings(database_url=url, database_retry_max_s=60)) as (app, client):
        live: LiveGoodput = app.state.live
        assert live.counts()["slo_set_loaded"] == 0
        assert (await client.get("/health")).status_code == 200
        ready = await client.get("/ready")
        assert (ready.status_code, ready.json()) == (503, {"detail": NOT_MIGRATED})
        await asyncio.to_thread(upgrade, url)
        ready = await client.get("/ready")
        assert ready.status_code == 200, ready.text
        assert live.loaded
        assert live.engine.slos == []
