"""GET /api/v1/goodput/stream over real HTTP: events once per interval, a client that
leaves, and a server that shuts down (SIGTERM) while a stream is open."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest

from controlplane.models import KeyRole
from exporters.records import Labels, RecordBatch, RequestRecord, Vantage
from exporters.wire import CONTENT_TYPE_BINARY, encode_batch
from tests.integration.controlplane.test_ingest_transport import (
    ServerFactory,
    empty_database,
    new_key,
    serve,
)

pytestmark = pytest.mark.integration
__all__ = ["serve"]  # the fixture, imported for this module's tests

STREAM = "/api/v1/goodput/stream"
SLO = {
    "name": "chat",
    "objectives": [{"metric": "ttft", "threshold_s": 0.5}],
    "target": 0.9,
    "window_s": 86_400,
}


async def events(response: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """``(event, data)`` pairs of an SSE response (``retry:``-only blocks skipped)."""
    name, data = "", ""
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
        elif line == "" and name:
            yield name, json.loads(data)
            name, data = "", ""


def one_request() -> bytes:
    record = RequestRecord(
        request_id="r0",
        vantage=Vantage.GATEWAY,
        arrival_time_ns=time.time_ns() - 2_000_000_000,
        labels=Labels(model="llama"),
        emission_offsets_us=np.array([100_000, 120_000]),
    )
    return encode_batch(RecordBatch.from_records([record]), exporter_id="sse", seq=0)


async def test_the_stream_sends_every_slo_each_interval(
    serve: ServerFactory, database_url: str
) -> None:
    server = serve(goodput_stream_interval_s=0.2)
    admin = {"Authorization": f"Bearer {await new_key(database_url, KeyRole.ADMIN)}"}
    async with httpx.AsyncClient(base_url=server.url, headers=admin, timeout=10) as http:
        assert (await http.post("/api/v1/slos", json=SLO)).status_code == 201
        await http.get("/api/v1/slos/chat/goodput?window=1m")
        async with http.stream("GET", STREAM) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            received: list[Any] = []
            started = time.monotonic()
            async for name, payload in events(response):
                assert name == "goodput"
                received.append(payload)
                if len(received) == 1:
                    ingest = {**admin, "Content-Type": CONTENT_TYPE_BINARY}
                    answer = await http.post(
                        "/api/v1/ingest", content=one_request(), headers=ingest
                    )
                    assert answer.status_code == 200
                if payload["slos"][0]["windows"]["1m"]["requests"] == 1:
                    break
                assert time.monotonic() - started < 5, "no event showed the ingested request"
        (slo,) = received[-1]["slos"]
        assert slo["slo_name"] == "chat"
        assert sorted(slo["windows"]) == ["10s", "1m", "5m"]
        assert slo["windows"]["10s"]["window_s"] == 10
        assert slo["windows"]["5m"]["good"] == 1
        assert len(received) >= 2
        # The client left; the server is still serving and stops promptly (fixture).
        assert (await http.get("/health")).status_code == 200


async def test_the_stream_needs_a_viewer_key(serve: ServerFactory, database_url: str) -> None:
    server = serve()
    ingest_key = await new_key(database_url, KeyRole.INGEST)
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        assert (await http.get(STREAM)).status_code == 401
        headers = {"Authorization": f"Bearer {ingest_key}"}
        assert (await http.get(STREAM, headers=headers)).status_code == 403


async def test_sigterm_ends_open_streams_and_the_server_exits(database_url: str) -> None:
    key = await new_key(database_url, KeyRole.VIEWER)
    env = {
        **os.environ,
        "GOODPUT_DATABASE_URL": database_url,
        "GOODPUT_GOODPUT_STREAM_INTERVAL_S": "0.2",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "controlplane.main:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--log-level",
            "info",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        url = ""
        deadline = time.monotonic() + 30
        while not url and time.monotonic() < deadline:
            line = await asyncio.to_thread(process.stderr.readline)
            match = re.search(r"Uvicorn running on (http://\S+)", line)
            url = match.group(1) if match else url
        assert url, "the server did not start"
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            asyncio.timeout(15),  # a stream that outlives the signal fails the test
            httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as http,
            http.stream("GET", STREAM) as response,
        ):
            seen = 0
            async for _ in events(response):
                seen += 1
                if seen == 2:
                    process.send_signal(signal.SIGTERM)
            # The loop ended: the server closed the stream on its own.
        assert seen >= 2
        # uvicorn re-raises the signal once its graceful shutdown is done: -SIGTERM.
        assert await asyncio.to_thread(process.wait, 15) in (0, -signal.SIGTERM)
        log = await asyncio.to_thread(process.stderr.read)
        assert "Waiting for application shutdown." in log
        assert "Application shutdown complete." in log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        await empty_database(database_url)
