"""The live runtime on both backends: SLO changes are polled, rollups are upserted on a
timer in one transaction, and a refused write is kept and retried."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import numpy as np
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from controlplane.db import create_engine_for, session_factory
from controlplane.models import GoodputRollup
from controlplane.runtime.live import LiveGoodput
from controlplane.settings import Settings
from exporters.records import Labels, RecordBatch, RequestRecord, Vantage

pytestmark = pytest.mark.integration

SLO = {
    "name": "chat",
    "objectives": [{"metric": "ttft", "threshold_s": 0.5}],
    "target": 0.9,
    "window_s": 86_400,
}


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, slo_poll_interval_s=0.05, rollup_interval_s=0.1)


def finishing_at(n: int, finish_time_s: float) -> RecordBatch:
    """``n`` requests of two tokens (TTFT 0.1 s) whose last token left at ``finish_time_s``."""
    arrival_ns = int((finish_time_s - 0.9) * 1e9)
    return RecordBatch.from_records(
        [
            RequestRecord(
                request_id=f"r{k}",
                vantage=Vantage.GATEWAY,
                arrival_time_ns=arrival_ns,
                labels=Labels(model="llama"),
                emission_offsets_us=np.array([100_000, 900_000]),
            )
            for k in range(n)
        ]
    )


async def eventually(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def rollup_rows(app: FastAPI) -> list[GoodputRollup]:
    async with app.state.sessions() as session:
        return list(await session.scalars(sa.select(GoodputRollup)))


async def test_slo_changes_reach_the_engine_without_a_query(
    app: FastAPI, client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    live: LiveGoodput = app.state.live
    created = (await client.post("/api/v1/slos", json=SLO, headers=admin_headers)).json()
    await eventually(lambda: live.spec(created["id"]) is not None)
    await client.patch("/api/v1/slos/chat", json={"target": 0.95}, headers=admin_headers)
    await eventually(lambda: live.spec(created["id"]).target == 0.95)  # type: ignore[union-attr]
    await client.delete("/api/v1/slos/chat", headers=admin_headers)
    await eventually(lambda: live.spec(created["id"]) is None)


async def test_complete_minutes_are_upserted_on_the_timer(
    app: FastAPI, client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    live: LiveGoodput = app.state.live
    created = (await client.post("/api/v1/slos", json=SLO, headers=admin_headers)).json()
    await live.refresh_slos()
    live.ingestor.apply_unsequenced(finishing_at(3, time.time() - 150))
    rows: list[GoodputRollup] = []

    async def written() -> bool:
        rows[:] = await rollup_rows(app)
        return bool(rows)

    deadline = time.monotonic() + 5
    while not await written():
        assert time.monotonic() < deadline, "no rollup written"
        await asyncio.sleep(0.05)
    (row,) = rows
    assert str(row.slo_id) == created["id"]
    assert (row.requests, row.good, row.output_tokens) == (3, 3, 6)
    assert row.minute_start.second == 0
    # A late record for the same minute re-emits it with full counts: an upsert, not a copy.
    live.ingestor.apply_unsequenced(finishing_at(2, row.minute_start.timestamp() + 30))
    await eventually(lambda: live.counts()["rollups_written"] >= 2)
    (row,) = await rollup_rows(app)
    assert row.requests == 5


async def test_a_refused_write_is_kept_and_retried(
    app: FastAPI, client: httpx.AsyncClient, admin_headers: dict[str, str], settings: Settings
) -> None:
    await client.post("/api/v1/slos", json=SLO, headers=admin_headers)
    unreachable = create_engine_for("postgresql+psycopg://nobody@127.0.0.1:1/none")
    # A second runtime beside the app's: the app's owns the write-ahead log.
    live = LiveGoodput(app.state.sessions, settings.model_copy(update={"durable_ingest": False}))
    await live.refresh_slos(force=True)
    live.ingestor.apply_unsequenced(finishing_at(4, time.time() - 180))
    live.sessions = session_factory(unreachable)
    try:
        assert await live.write_rollups() == 0
        assert live.counts()["write_failures"] == 1
        assert live.counts()["rollups_pending"] == 1
    finally:
        await unreachable.dispose()
    live.sessions = app.state.sessions
    assert await live.write_rollups() == 1
    assert live.counts()["rollups_pending"] == 0
    (row,) = await rollup_rows(app)
    assert row.requests == 4
