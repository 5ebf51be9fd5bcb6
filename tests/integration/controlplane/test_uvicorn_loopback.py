"""The app under a real uvicorn server on 127.0.0.1: real sockets, lifespan, HTTP/1.1."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
import uvicorn

from controlplane.db import utcnow
from controlplane.main import create_app
from controlplane.models import SCHEMA_REVISION, KeyRole
from controlplane.services import keys as key_service
from controlplane.settings import Settings

from .conftest import empty_tables

pytestmark = pytest.mark.integration


async def test_full_flow_over_real_http(database_url: str) -> None:
    app = create_app(Settings(database_url=database_url))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.02)
        assert server.started
        async with app.state.sessions() as session, session.begin():
            _, key = await key_service.create_key(
                session, name="loopback", role=KeyRole.ADMIN, tenant=None, actor="cli", now=utcnow()
            )
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            assert (await http.get("/health")).json() == {"status": "ok"}
            ready = await http.get("/ready")
            assert ready.status_code == 200
            assert ready.json()["schema_revision"] == SCHEMA_REVISION
            body = {
                "name": "http",
                "objectives": [{"metric": "ttft", "threshold_s": 1}],
                "target": 0.9,
            }
            created = await http.post("/api/v1/slos", json=body, headers=headers)
            assert created.status_code == 201
            docs = await http.get("/docs")
            assert docs.status_code == 200
            schema = (await http.get("/openapi.json")).json()
            assert "/api/v1/slos:import" in schema["paths"]
            assert (await http.delete("/api/v1/slos/http", headers=headers)).status_code == 204
    finally:
        if server.started:  # leave the shared database empty, while the app's engine is open
            await empty_tables(app)
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=10)
        sock.close()
