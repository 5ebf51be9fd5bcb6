"""Fleet: agents register and beat; viewers list; staleness is reported, not guessed away."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI

from controlplane.main import create_app
from controlplane.settings import Settings

pytestmark = pytest.mark.integration

WORKER = {
    "id": "worker-0",
    "kind": "worker",
    "endpoint": "http://10.0.0.5:8100",
    "model": "llama",
    "role": "decode",
}


@pytest_asyncio.fixture(loop_scope="function")
async def agent_headers(make_key: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {await make_key('agent')}"}


async def test_register_heartbeat_and_list(
    client: httpx.AsyncClient,
    agent_headers: dict[str, str],
    viewer_headers: dict[str, str],
    admin_headers: dict[str, str],
) -> None:
    response = await client.post("/api/v1/fleet/register", json=WORKER, headers=agent_headers)
    assert response.status_code == 200, response.text
    member = response.json()
    assert (member["state"], member["stale"], member["role"]) == ("starting", False, "decode")
    beat = await client.post(
        "/api/v1/fleet/worker-0/heartbeat",
        json={"state": "ready", "load": {"running": 3, "kv_usage": 0.4}},
        headers=agent_headers,
    )
    assert beat.status_code == 200
    assert beat.json()["state"] == "ready"
    assert beat.json()["load"] == {"running": 3, "kv_usage": 0.4}
    listed = (await client.get("/api/v1/fleet?role=decode", headers=viewer_headers)).json()
    assert [m["id"] for m in listed["data"]] == ["worker-0"]
    assert listed["data"][0]["last_heartbeat_at"] >= member["last_heartbeat_at"]
    empty = (await client.get("/api/v1/fleet?kind=gateway", headers=viewer_headers)).json()
    assert empty == {"data": [], "count": 0}
    audit = await client.get("/api/v1/audit?target_type=fleet_member", headers=admin_headers)
    assert [e["action"] for e in audit.json()["data"]] == ["fleet.state", "fleet.register"]


async def test_load_only_heartbeats_are_not_audited(
    client: httpx.AsyncClient, agent_headers: dict[str, str], admin_headers: dict[str, str]
) -> None:
    await client.post("/api/v1/fleet/register", json=WORKER, headers=agent_headers)
    for running in range(3):
        await client.post(
            "/api/v1/fleet/worker-0/heartbeat",
            json={"load": {"running": running}},
            headers=agent_headers,
        )
    audit = await client.get("/api/v1/audit?target_type=fleet_member", headers=admin_headers)
    assert audit.json()["count"] == 1


async def test_reregistration_refreshes_and_keeps_registered_at(
    client: httpx.AsyncClient, agent_headers: dict[str, str]
) -> None:
    first = (await client.post("/api/v1/fleet/register", json=WORKER, headers=agent_headers)).json()
    again = await client.post(
        "/api/v1/fleet/register", json={**WORKER, "role": "prefill"}, headers=agent_headers
    )
    assert again.json()["role"] == "prefill"
    assert again.json()["registered_at"] == first["registered_at"]


async def test_heartbeat_of_unknown_member_says_register_first(
    client: httpx.AsyncClient, agent_headers: dict[str, str]
) -> None:
    response = await client.post("/api/v1/fleet/ghost/heartbeat", json={}, headers=agent_headers)
    assert response.status_code == 404
    assert response.json() == {"detail": "fleet member 'ghost' not found; register it first"}


@pytest.mark.parametrize(
    ("patch", "field", "msg"),
    [
        ({"kind": "router"}, "kind", "kind must be one of 'gateway' or 'worker', got 'router'"),
        ({"id": "-bad"}, "id", "id must match ^[A-Za-z0-9][A-Za-z0-9._:@-]*$, got '-bad'"),
        (
            {"endpoint": "ftp://x"},
            "endpoint",
            "endpoint must match ^https?://[!-~]+$, got 'ftp://x'",
        ),
    ],
)
async def test_invalid_registration_is_422(
    client: httpx.AsyncClient,
    agent_headers: dict[str, str],
    patch: dict[str, Any],
    field: str,
    msg: str,
) -> None:
    response = await client.post(
        "/api/v1/fleet/register", json={**WORKER, **patch}, headers=agent_headers
    )
    assert response.status_code == 422
    assert [(d["field"], d["msg"]) for d in response.json()["detail"]] == [(field, msg)]


async def test_member_without_recent_heartbeat_is_stale(
    database_url: str, app: FastAPI, make_key: Any
) -> None:
    strict = create_app(Settings(database_url=database_url, fleet_heartbeat_timeout_s=1e-6))
    async with strict.router.lifespan_context(strict):
        transport = httpx.ASGITransport(app=strict)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            agent = {"Authorization": f"Bearer {await make_key('agent')}"}
            await client.post("/api/v1/fleet/register", json=WORKER, headers=agent)
            viewer = {"Authorization": f"Bearer {await make_key('viewer')}"}
            member = (await client.get("/api/v1/fleet/worker-0", headers=viewer)).json()
    assert member["stale"] is True
    assert member["state"] == "starting"
