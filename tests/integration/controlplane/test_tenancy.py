"""Tenancy and agents (issue 15): a tenant-scoped key reaches its tenant's SLOs and nothing
of the cluster (fleet, commands, automation); an agent key acts only for the members it
registered."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.controlplane.conftest import MakeKey, bearer
from tests.integration.controlplane.test_fleet_registry import WORKER as FLEET_WORKER

pytestmark = pytest.mark.integration

WORKER = {**FLEET_WORKER, "id": "worker-a"}
CLUSTER_FORBIDDEN = (
    "this route acts on the whole cluster (fleet, commands, automation); key "
    "'test-{role}' is scoped to tenant 'acme'"
)


@pytest.mark.parametrize(
    ("role", "method", "path", "body"),
    [
        ("viewer", "GET", "/api/v1/fleet", None),
        ("viewer", "GET", "/api/v1/fleet/worker-a", None),
        ("viewer", "GET", "/api/v1/commands", None),
        ("viewer", "GET", "/api/v1/automation", None),
        ("viewer", "GET", "/api/v1/automation/moves", None),
        ("viewer", "GET", "/api/v1/automation/pins", None),
        ("operator", "POST", "/api/v1/commands", {"kind": "drain", "target": "worker-a"}),
        ("operator", "POST", "/api/v1/automation/pause", {"reason": "x"}),
        ("operator", "POST", "/api/v1/automation/resume", {"reason": "x"}),
        ("operator", "PUT", "/api/v1/automation/pins/worker-a", {"role": "decode"}),
        ("operator", "DELETE", "/api/v1/automation/pins/worker-a", None),
    ],
)
async def test_tenant_keys_never_reach_the_cluster(
    client: httpx.AsyncClient,
    make_key: MakeKey,
    role: str,
    method: str,
    path: str,
    body: dict[str, str] | None,
) -> None:
    """Regression: a tenant operator key could issue fleet commands, pause automation and
    pin any member; a tenant viewer read every tenant's fleet, commands and moves."""
    headers = bearer(await make_key(role, tenant="acme"))
    response = await client.request(method, path, json=body, headers=headers)
    assert response.status_code == 403, response.text
    assert response.json() == {"detail": CLUSTER_FORBIDDEN.format(role=role)}


async def test_an_agent_key_acts_only_for_the_members_it_registered(
    client: httpx.AsyncClient, make_key: MakeKey, admin_headers: dict[str, str]
) -> None:
    """Regression: any agent key could re-register any member id (overwriting its endpoint)
    and ack its commands."""
    owner = bearer(await make_key("agent", name="owner"))
    intruder = bearer(await make_key("agent", name="intruder"))
    registered = await client.post("/api/v1/fleet/register", json=WORKER, headers=owner)
    assert registered.status_code == 200, registered.text
    refused = (
        "fleet member 'worker-a' is registered by another agent key; an agent key acts only "
        "for the members it registered"
    )
    hijack = {**WORKER, "endpoint": "http://evil:1"}
    command = await client.post(
        "/api/v1/commands", json={"kind": "drain", "target": "worker-a"}, headers=admin_headers
    )
    assert command.status_code == 201, command.text
    command_id = command.json()["id"]
    ack = {"v": 1, "command_id": command_id, "target": "worker-a", "ok": True, "detail": "",
           "acked_time_ns": 1}  # fmt: skip
    for method, path, body in (
        ("POST", "/api/v1/fleet/register", hijack),
        ("POST", "/api/v1/fleet/worker-a/heartbeat", {"state": "ready"}),
        ("GET", "/api/v1/fleet/worker-a/commands", None),
        ("POST", f"/api/v1/fleet/worker-a/commands/{command_id}/ack", ack),
    ):
        response = await client.request(method, path, json=body, headers=intruder)
        assert (response.status_code, response.json()) == (403, {"detail": refused}), path
    member = (await client.get("/api/v1/fleet/worker-a", headers=admin_headers)).json()
    assert member["endpoint"] == WORKER["endpoint"]
    polled = await client.get("/api/v1/fleet/worker-a/commands", headers=owner)
    assert [c["id"] for c in polled.json()["data"]] == [command_id]
    # One key may hold several members (a host's agent); an admin key acts for any.
    other = await client.post(
        "/api/v1/fleet/register", json={**WORKER, "id": "worker-b"}, headers=owner
    )
    assert other.status_code == 200
    beat = await client.post(
        "/api/v1/fleet/worker-a/heartbeat", json={"state": "ready"}, headers=admin_headers
    )
    assert beat.status_code == 200, beat.text
