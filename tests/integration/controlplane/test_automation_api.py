"""The /automation routes on PostgreSQL and SQLite: pins, manual moves (idempotent by id),
roles, errors that name the field, audit."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from controlplane.models import Command, KeyRole

from .conftest import MakeKey, bearer

pytestmark = pytest.mark.integration

AUTOMATION = "/api/v1/automation"
MEMBER = "10.0.0.7:8100"


@pytest.fixture
async def registered(client: httpx.AsyncClient, make_key: MakeKey) -> None:
    headers = bearer(await make_key(KeyRole.AGENT))
    body = {
        "id": MEMBER,
        "kind": "worker",
        "endpoint": f"http://{MEMBER}",
        "role": "decode",
        "state": "ready",
        "load": {"num_requests_running": 4, "num_requests_waiting": 0},
    }
    response = await client.post("/api/v1/fleet/register", json=body, headers=headers)
    assert response.status_code == 200, response.text


async def test_manual_move_is_idempotent_by_id_and_audited(
    app: FastAPI,
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    admin_headers: dict[str, str],
    registered: None,
) -> None:
    move_id = str(uuid.uuid4())
    body = {"id": move_id, "member_id": MEMBER, "role": "prefill", "reason": "prefill queue"}
    created = await client.post(f"{AUTOMATION}/moves", json=body, headers=operator_headers)
    assert created.status_code == 201, created.text
    move = created.json()
    assert (move["id"], move["state"], move["from_role"], move["to_role"]) == (
        move_id,
        "draining",
        "decode",
        "prefill",
    )
    assert move["mode"] == "routing"
    assert move["evidence"]["source"] == "manual"
    assert move["evidence"]["load"] == {"num_requests_running": 4, "num_requests_waiting": 0}
    (command_id,) = move["command_ids"]
    command = await client.get(f"/api/v1/commands/{command_id}", headers=operator_headers)
    assert command.json()["kind"] == "drain" and command.json()["target"] == MEMBER

    again = await client.post(f"{AUTOMATION}/moves", json=body, headers=operator_headers)
    assert again.status_code == 200 and again.json()["id"] == move_id
    other = await client.post(
        f"{AUTOMATION}/moves", json={**body, "reason": "other"}, headers=operator_headers
    )
    assert other.status_code == 409
    assert "exists with a different body" in other.json()["detail"]
    busy = await client.post(
        f"{AUTOMATION}/moves", json={**body, "id": str(uuid.uuid4())}, headers=operator_headers
    )
    assert busy.status_code == 409 and "is already moving" in busy.json()["detail"]
    async with app.state.sessions() as session:
        assert await session.scalar(sa.select(sa.func.count()).select_from(Command)) == 1

    audit = await client.get(
        "/api/v1/audit", params={"action": "move.start"}, headers=admin_headers
    )
    (entry,) = audit.json()["data"]
    assert entry["target_id"] == move_id and entry["actor"].startswith("key:")
    listed = await client.get(
        f"{AUTOMATION}/moves",
        params={"state": "draining", "member_id": MEMBER},
        headers=operator_headers,
    )
    assert listed.json()["count"] == 1


async def test_pins(
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    viewer_headers: dict[str, str],
    admin_headers: dict[str, str],
    registered: None,
) -> None:
    path = f"{AUTOMATION}/pins/{MEMBER}"
    first = await client.put(
        path, json={"role": "decode", "reason": "hot"}, headers=operator_headers
    )
    assert first.status_code == 201 and first.json()["role"] == "decode"
    second = await client.put(path, json={"role": "decode"}, headers=operator_headers)
    assert second.status_code == 200
    pins = await client.get(f"{AUTOMATION}/pins", headers=viewer_headers)
    assert [p["member_id"] for p in pins.json()] == [MEMBER]
    refused = await client.post(
        f"{AUTOMATION}/moves",
        json={"member_id": MEMBER, "role": "prefill"},
        headers=operator_headers,
    )
    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        f"fleet member {MEMBER!r} is pinned to 'decode'; unpin it first"
    )
    assert (await client.delete(path, headers=operator_headers)).status_code == 204
    gone = await client.delete(path, headers=operator_headers)
    assert gone.status_code == 404
    assert gone.json()["detail"] == f"fleet member {MEMBER!r} has no role pin"
    audit = await client.get(
        "/api/v1/audit",
        params={"target_type": "fleet_member", "target_id": MEMBER},
        headers=admin_headers,
    )
    actions = [e["action"] for e in audit.json()["data"]]
    assert actions[:3] == ["role.unpin", "role.pin", "role.pin"]


async def test_errors_name_the_field(
    client: httpx.AsyncClient, operator_headers: dict[str, str], registered: None
) -> None:
    bad_role = await client.put(
        f"{AUTOMATION}/pins/{MEMBER}", json={"role": "sideways"}, headers=operator_headers
    )
    assert bad_role.status_code == 422
    (error,) = bad_role.json()["detail"]
    assert error["loc"] == ["body", "role"]
    assert "'prefill', 'decode' or 'both'" in error["msg"] and "sideways" in error["msg"]
    bad_move = await client.post(
        f"{AUTOMATION}/moves", json={"member_id": MEMBER, "role": "both"}, headers=operator_headers
    )
    assert bad_move.status_code == 422
    assert bad_move.json()["detail"][0]["loc"] == ["body", "role"]
    unknown = await client.post(
        f"{AUTOMATION}/moves",
        json={"member_id": "nobody", "role": "prefill"},
        headers=operator_headers,
    )
    assert unknown.status_code == 404
    same = await client.post(
        f"{AUTOMATION}/moves",
        json={"member_id": MEMBER, "role": "decode"},
        headers=operator_headers,
    )
    assert same.status_code == 409
    assert same.json()["detail"] == f"fleet member {MEMBER!r} already has role 'decode'"
    extra = await client.post(
        f"{AUTOMATION}/pause", json={"paused": True}, headers=operator_headers
    )
    assert extra.status_code == 422 and extra.json()["detail"][0]["loc"] == ["body", "paused"]


async def test_roles(
    client: httpx.AsyncClient, viewer_headers: dict[str, str], registered: None
) -> None:
    for method, path, body in (
        ("POST", f"{AUTOMATION}/pause", {}),
        ("POST", f"{AUTOMATION}/tick", None),
        ("PUT", f"{AUTOMATION}/pins/{MEMBER}", {"role": "decode"}),
        ("POST", f"{AUTOMATION}/moves", {"member_id": MEMBER, "role": "prefill"}),
    ):
        response = await client.request(method, path, json=body, headers=viewer_headers)
        assert response.status_code == 403, (method, path)
    status: dict[str, Any] = (await client.get(AUTOMATION, headers=viewer_headers)).json()
    assert status["planner"]["paused"] is False and status["open_moves"] == 0
    assert status["enabled"] is True and status["interval_s"] > 0
