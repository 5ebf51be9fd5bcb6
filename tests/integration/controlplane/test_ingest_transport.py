"""The real ControlPlaneExporter → a real uvicorn server of the app on loopback, and a
restart of the app on the same database (rollups carry the long windows across).

``AppServer`` (uvicorn in a thread, port chosen by the OS) and ``new_key`` are shared with
the OTLP and goodput-stream tests.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import numpy as np
import pytest
import sqlalchemy as sa
import uvicorn

from controlplane.db import create_engine_for, session_factory, utcnow
from controlplane.main import create_app
from controlplane.models import Base, GoodputRollup, KeyRole
from controlplane.services import keys as key_service
from controlplane.settings import Settings
from exporters.recorder import RequestRecorder
from exporters.records import Labels, RequestRecord, Status, Vantage
from exporters.transport import ControlPlaneExporter

pytestmark = pytest.mark.integration

CHAT = {
    "name": "chat",
    "selector": {"model": "llama"},
    "objectives": [{"metric": "ttft", "threshold_s": 5.0}],
    "target": 0.9,
    "window_s": 86_400,
}


class AppServer:
    """``create_app(settings)`` served by uvicorn in a thread; ``stop()`` runs the app's
    lifespan shutdown (final rollup write) before it returns."""

    def __init__(self, settings: Settings) -> None:
        self.app = create_app(settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="app-server", daemon=True)

    def start(self) -> AppServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the app server did not start")
            time.sleep(0.02)
        return self

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "the app server did not stop"


async def new_key(database_url: str, role: KeyRole, tenant: str | None = None) -> str:
    engine = create_engine_for(database_url)
    try:
        async with session_factory(engine)() as session, session.begin():
            _, secret = await key_service.create_key(
                session,
                name=f"k-{role.value}-{time.monotonic_ns()}",
                role=role,
                tenant=tenant,
                actor="cli",
                now=utcnow(),
            )
    finally:
        await engine.dispose()
    return secret


async def empty_database(database_url: str) -> None:
    engine = create_engine_for(database_url)
    try:
        async with engine.begin() as conn:
            for table in reversed(Base.metadata.sorted_tables):
                await conn.execute(sa.delete(table))
    finally:
        await engine.dispose()


ServerFactory = Callable[..., AppServer]


@pytest.fixture
async def serve(database_url: str) -> AsyncIterator[ServerFactory]:
    """Start app servers on the test database; stops them and empties the tables after."""
    started: list[AppServer] = []

    def start(**overrides: Any) -> AppServer:
        settings = Settings(database_url=database_url, slo_poll_interval_s=0.1, **overrides)
        server = AppServer(settings).start()
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            if server.thread.is_alive():
                await asyncio.to_thread(server.stop)
        await empty_database(database_url)


async def wait_for(check: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.05)


async def test_the_real_exporter_delivers_records_that_show_up_in_goodput(
    serve: ServerFactory, database_url: str
) -> None:
    server = serve()
    admin = {"Authorization": f"Bearer {await new_key(database_url, KeyRole.ADMIN)}"}
    ingest_key = await new_key(database_url, KeyRole.INGEST)
    async with httpx.AsyncClient(base_url=server.url, headers=admin) as http:
        assert (await http.post("/api/v1/slos", json=CHAT)).status_code == 201
        assert (await http.get("/api/v1/slos/chat/goodput?window=1m")).json()["requests"] == 0

        exporter = ControlPlaneExporter(
            server.url, api_key=ingest_key, flush_interval_s=0.05, max_batch_records=7
        )
        recorder = RequestRecorder(Vantage.GATEWAY, exporter)
        for k in range(40):
            trace = recorder.start(f"r{k}", Labels(model="llama"))
            trace.token()
            trace.tokens(4)
            trace.finish()
        other = recorder.start("elsewhere", Labels(model="mistral"))
        other.token()
        other.finish()
        assert await asyncio.to_thread(exporter.force_flush, 10.0)
        await asyncio.to_thread(exporter.shutdown, 5.0)
        stats = exporter.stats()
        assert (stats.num_exported_records, stats.num_rejected_records) == (41, 0)
        assert stats.num_sent_batches == 6  # 41 records in batches of at most 7

        body = (await http.get("/api/v1/slos/chat/goodput?window=1m")).json()
        assert (body["requests"], body["good"], body["output_tokens"]) == (40, 40, 200)
        assert body["attainment_ratio"] == 1.0
        assert body["ttft"]["p99_s"] is not None
        metrics = (await http.get("/metrics")).text
        assert 'goodput_ingest_records_total{protocol="wire"} 41.0' in metrics


async def test_the_exporter_counts_refused_records_and_delivers_the_rest(
    serve: ServerFactory, database_url: str
) -> None:
    server = serve()
    admin = {"Authorization": f"Bearer {await new_key(database_url, KeyRole.ADMIN)}"}
    async with httpx.AsyncClient(base_url=server.url, headers=admin) as http:
        assert (await http.post("/api/v1/slos", json=CHAT)).status_code == 201
        # The engine polls the SLO table every second; a read loads a new SLO at once.
        await http.get("/api/v1/slos/chat/goodput?window=1m")
        exporter = ControlPlaneExporter(
            server.url, api_key=await new_key(database_url, KeyRole.INGEST), flush_interval_s=0.05
        )
        recorder = RequestRecorder(Vantage.GATEWAY, exporter)
        for k in range(10):
            trace = recorder.start("same" if k < 3 else f"r{k}", Labels(model="llama"))
            trace.token()
            trace.finish()
        assert await asyncio.to_thread(exporter.force_flush, 10.0)
        await asyncio.to_thread(exporter.shutdown, 5.0)
        stats = exporter.stats()
        # Three final records of request "same" in one batch: one is counted, two refused.
        assert (stats.num_exported_records, stats.num_rejected_records) == (8, 2)
        assert stats.num_rejected_batches == 0
        body = (await http.get("/api/v1/slos/chat/goodput?window=1m")).json()
        assert body["requests"] == 8


async def test_long_window_stats_survive_a_restart(serve: ServerFactory, database_url: str) -> None:
    first = serve()
    admin = {"Authorization": f"Bearer {await new_key(database_url, KeyRole.ADMIN)}"}
    ingest_key = await new_key(database_url, KeyRole.INGEST)
    objectives = [{"metric": "ttft", "threshold_s": 0.001}, {"metric": "e2el", "threshold_s": 60}]
    async with httpx.AsyncClient(base_url=first.url, headers=admin) as http:
        body = {**CHAT, "objectives": objectives}
        assert (await http.post("/api/v1/slos", json=body)).status_code == 201
        await http.get("/api/v1/slos/chat/goodput?window=1m")  # the engine has the SLO now
        exporter = ControlPlaneExporter(first.url, api_key=ingest_key, flush_interval_s=0.05)
        recorder = RequestRecorder(Vantage.GATEWAY, exporter)
        for k in range(30):
            trace = recorder.start(f"r{k}", Labels(model="llama"))
            if k % 3 == 0:
                time.sleep(0.002)  # slower than the 1 ms TTFT objective: bad
            trace.token()
            trace.tokens(2)
            trace.finish()
        await asyncio.to_thread(exporter.shutdown, 10.0)
        before = {
            window: (await http.get(f"/api/v1/slos/chat/goodput?window={window}")).json()
            for window in ("1h", "1d", "compliance")
        }
    assert before["compliance"]["requests"] == 30
    assert before["compliance"]["violations"]["ttft"] >= 10
    await asyncio.to_thread(first.stop)  # writes every minute held, the current one too

    second = serve()
    async with httpx.AsyncClient(base_url=second.url, headers=admin) as http:
        for window, old in before.items():
            new = (await http.get(f"/api/v1/slos/chat/goodput?window={window}")).json()
            for field in ("requests", "good", "bad", "output_tokens", "violations"):
                assert new[field] == old[field], (window, field)
            assert new["attainment_ratio"] == old["attainment_ratio"]
            assert new["error_budget_remaining_ratio"] == old["error_budget_remaining_ratio"]
            for metric in ("ttft", "e2el"):
                assert new[metric] == old[metric], (window, metric)


def _classes_and_vantages(finish_s: int) -> list[RequestRecord]:
    """OK requests of the SLO's model at both vantages (TTFT 0.2 s at the gateway, 0.05 s
    at the engine) and rejected ones in two priority classes, all finishing at ``finish_s``."""
    finish_ns = finish_s * 1_000_000_000
    records = [
        RequestRecord(
            request_id=f"{vantage.name}-{k}",
            vantage=vantage,
            arrival_time_ns=finish_ns - ttft_us * 1000 - k * 1000,
            labels=Labels(model="llama"),
            emission_offsets_us=np.array([ttft_us + k]),
        )
        for vantage, ttft_us in ((Vantage.GATEWAY, 200_000), (Vantage.ENGINE, 50_000))
        for k in range(20)
    ]
    records += [
        RequestRecord(
            request_id=f"shed-{k}",
            vantage=Vantage.GATEWAY,
            arrival_time_ns=finish_ns,
            labels=Labels(model="llama", priority="batch" if k % 3 else "interactive"),
            emission_offsets_us=np.zeros(0, dtype=np.int64),
            status=Status.REJECTED,
        )
        for k in range(9)
    ]
    return records


def _series_summary(body: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """A series' rejections per class summed over its steps, and per vantage and column the
    distinct percentiles of its steps (the steps move with the clock; the records do not)."""
    by_class = {name: sum(values) for name, values in body["rejected_by_class"].items()}
    by_vantage = {
        vantage: {column: sorted({v for v in values if v is not None})
                  for column, values in columns.items()}
        for vantage, columns in body["percentiles_by_vantage"].items()
    }  # fmt: skip
    return by_class, by_vantage


async def test_rejections_by_class_and_percentiles_by_vantage_survive_a_restart(
    serve: ServerFactory, database_url: str
) -> None:
    first = serve()
    admin = {"Authorization": f"Bearer {await new_key(database_url, KeyRole.ADMIN)}"}
    ingest_key = await new_key(database_url, KeyRole.INGEST)
    # Early in the previous minute: one 10-s slot, where a restored minute's sketches go.
    finish_s = int(time.time()) // 60 * 60 - 55
    async with httpx.AsyncClient(base_url=first.url, headers=admin) as http:
        assert (await http.post("/api/v1/slos", json=CHAT)).status_code == 201
        slo_id = (await http.get("/api/v1/slos/chat")).json()["id"]
        await http.get("/api/v1/slos/chat/goodput?window=1m")  # the engine has the SLO now
        exporter = ControlPlaneExporter(first.url, api_key=ingest_key, flush_interval_s=0.05)
        for record in _classes_and_vantages(finish_s):
            exporter.export(record)
        assert await asyncio.to_thread(exporter.force_flush, 10.0)
        await asyncio.to_thread(exporter.shutdown, 5.0)
        before = _series_summary(
            (await http.get("/api/v1/slos/chat/goodput/series?range=1h")).json()
        )
    engine = first.app.state.live.engine
    classes_before = engine.rejected_by_class(slo_id, "1d")
    vantages_before = engine.vantage_percentiles(slo_id, "1h")
    assert classes_before == {"batch": 6, "interactive": 3}
    assert before[0] == {"batch": 6.0, "interactive": 3.0}
    assert before[1]["engine"]["ttft_p50_s"] == [pytest.approx(0.05, rel=0.02)]
    await asyncio.to_thread(first.stop)  # writes every minute held

    db = create_engine_for(database_url)
    try:
        async with session_factory(db)() as session:
            (row,) = await session.scalars(sa.select(GoodputRollup))
            assert row.rejected_by_class == {"batch": 6, "interactive": 3}
            assert row.other_sketch_blob and row.vantage == "gateway"
    finally:
        await db.dispose()

    second = serve()
    async with httpx.AsyncClient(base_url=second.url, headers=admin) as http:
        after = _series_summary(
            (await http.get("/api/v1/slos/chat/goodput/series?range=1h")).json()
        )
    assert after == before
    engine = second.app.state.live.engine
    assert engine.rejected_by_class(slo_id, "1d") == classes_before
    assert engine.vantage_percentiles(slo_id, "1h") == vantages_before
