"""Command delivery: operators issue, agents poll and acknowledge, viewers read; on
PostgreSQL and SQLite, and once with the real worker agent over loopback HTTP."""

from __future__ import annotations

import asyncio
import re
import socket
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import uvicorn
from fastapi import FastAPI

from controlplane.db import utcnow
from controlplane.models import Command, CommandState, KeyRole
from exporters.commands import CommandAck, CommandKind, command_from_json
from serving.workers.agent import Agent, AgentReport, AgentSettings

from .conftest import MakeKey, bearer

pytestmark = pytest.mark.integration

MEMBER = "10.0.0.7:8100"
OTHER = "10.0.0.8:8100"


async def register(client: httpx.AsyncClient, headers: dict[str, str], member: str) -> None:
    body = {"id": member, "kind": "worker", "endpoint": f"http://{member}"}
    response = await client.post("/api/v1/fleet/register", json=body, headers=headers)
    assert response.status_code == 200, response.text


@pytest.fixture
async def agent_headers(client: httpx.AsyncClient, make_key: MakeKey) -> dict[str, str]:
    headers = bearer(await make_key(KeyRole.AGENT, name="test-agent"))
    await register(client, headers, MEMBER)
    await register(client, headers, OTHER)
    return headers


def drain(target: str = MEMBER, **extra: Any) -> dict[str, Any]:
    return {"kind": "drain", "target": target, **extra}


async def issue(
    client: httpx.AsyncClient, headers: dict[str, str], body: Mapping[str, Any]
) -> dict[str, Any]:
    response = await client.post("/api/v1/commands", json=body, headers=headers)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def poll(
    client: httpx.AsyncClient, headers: dict[str, str], member: str = MEMBER
) -> list[dict[str, Any]]:
    response = await client.get(f"/api/v1/fleet/{member}/commands", headers=headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["count"] == len(body["data"])
    data: list[dict[str, Any]] = body["data"]
    return data


def ack_of(command_id: str, *, ok: bool = True, target: str = MEMBER) -> dict[str, Any]:
    return CommandAck(command_id, target, ok, "applied" if ok else "refused", 123).to_json()


async def test_deliver_then_ack(
    client: httpx.AsyncClient, operator_headers: dict[str, str], agent_headers: dict[str, str]
) -> None:
    role = await issue(
        client,
        operator_headers,
        {"kind": "set_role", "target": MEMBER, "payload": {"role": "decode"}, "ttl_s": 60},
    )
    assert role["state"] == "pending" and role["version"] == 1 and role["attempts"] == 0
    delivered = await poll(client, agent_headers)
    assert [c["id"] for c in delivered] == [role["id"]]
    command = command_from_json(delivered[0])  # exactly the agent's contract
    assert command.kind is CommandKind.SET_ROLE and command.target == MEMBER
    assert command.expires_time_ns - command.issued_time_ns == 60 * 10**9
    assert await poll(client, agent_headers) == []  # delivered, not due again yet
    assert await poll(client, agent_headers, OTHER) == []

    path = f"/api/v1/fleet/{MEMBER}/commands/{role['id']}/ack"
    acked = await client.post(path, json=ack_of(role["id"]), headers=agent_headers)
    assert acked.status_code == 200, acked.text
    public = acked.json()
    assert public["state"] == "acked" and public["attempts"] == 1
    assert public["delivered_at"] is not None and public["acked_at"] is not None
    assert public["ack"] == ack_of(role["id"])

    # Idempotent: the same ack again, or a later different one, changes nothing.
    again = await client.post(path, json=ack_of(role["id"]), headers=agent_headers)
    assert again.status_code == 200 and again.json() == public
    refused = await client.post(path, json=ack_of(role["id"], ok=False), headers=agent_headers)
    assert refused.status_code == 200 and refused.json() == public


async def test_refusal_is_failed_and_version_rises_per_kind(
    client: httpx.AsyncClient, operator_headers: dict[str, str], agent_headers: dict[str, str]
) -> None:
    first = await issue(client, operator_headers, drain())
    second = await issue(client, operator_headers, drain())
    resume = await issue(client, operator_headers, {"kind": "resume", "target": MEMBER})
    assert (first["version"], second["version"], resume["version"]) == (1, 2, 1)
    delivered = await poll(client, agent_headers)
    assert [c["id"] for c in delivered] == [first["id"], second["id"], resume["id"]]
    path = f"/api/v1/fleet/{MEMBER}/commands/{first['id']}/ack"
    failed = await client.post(path, json=ack_of(first["id"], ok=False), headers=agent_headers)
    assert failed.json()["state"] == "failed"


async def test_expired_commands_are_not_delivered(
    client: httpx.AsyncClient, operator_headers: dict[str, str], agent_headers: dict[str, str]
) -> None:
    short = await issue(client, operator_headers, drain(ttl_s=0.001))
    await asyncio.sleep(0.01)
    assert await poll(client, agent_headers) == []
    read = await client.get(f"/api/v1/commands/{short['id']}", headers=operator_headers)
    assert read.json()["state"] == "expired" and read.json()["attempts"] == 0


async def test_unacked_delivery_is_delivered_again_later(
    app: FastAPI,
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    agent_headers: dict[str, str],
) -> None:
    created = await issue(client, operator_headers, drain())
    assert len(await poll(client, agent_headers)) == 1
    async with app.state.sessions() as session, session.begin():
        await session.execute(
            sa.update(Command).values(delivered_at=utcnow() - timedelta(minutes=5))
        )
    again = await poll(client, agent_headers)
    assert [c["id"] for c in again] == [created["id"]]
    read = await client.get(f"/api/v1/commands/{created['id']}", headers=operator_headers)
    assert read.json()["attempts"] == 2


async def test_ack_of_unknown_or_foreign_command_is_404(
    client: httpx.AsyncClient, operator_headers: dict[str, str], agent_headers: dict[str, str]
) -> None:
    created = await issue(client, operator_headers, drain())
    unknown = str(uuid.uuid4())
    response = await client.post(
        f"/api/v1/fleet/{MEMBER}/commands/{unknown}/ack",
        json=ack_of(unknown),
        headers=agent_headers,
    )
    assert response.status_code == 404
    assert unknown in response.json()["detail"]
    foreign = await client.post(
        f"/api/v1/fleet/{OTHER}/commands/{created['id']}/ack",
        json=ack_of(created["id"], target=OTHER),
        headers=agent_headers,
    )
    assert foreign.status_code == 404
    mismatch = await client.post(
        f"/api/v1/fleet/{MEMBER}/commands/{created['id']}/ack",
        json=ack_of(unknown),
        headers=agent_headers,
    )
    assert mismatch.status_code == 422
    assert mismatch.json()["detail"][0]["loc"] == ["body", "command_id"]


async def test_issue_is_idempotent_by_client_id(
    client: httpx.AsyncClient, operator_headers: dict[str, str], agent_headers: dict[str, str]
) -> None:
    command_id = str(uuid.uuid4())
    body = drain(id=command_id)
    created = await issue(client, operator_headers, body)
    assert created["id"] == command_id
    replay = await client.post("/api/v1/commands", json=body, headers=operator_headers)
    assert replay.status_code == 200 and replay.json() == created
    other = await client.post(
        "/api/v1/commands", json={**body, "kind": "resume"}, headers=operator_headers
    )
    assert other.status_code == 409
    assert command_id in other.json()["detail"]
    listed = await client.get("/api/v1/commands", headers=operator_headers)
    assert listed.json()["count"] == 1


async def test_issue_validation_names_the_field(
    client: httpx.AsyncClient, operator_headers: dict[str, str], agent_headers: dict[str, str]
) -> None:
    bad_role = {"kind": "set_role", "target": MEMBER, "payload": {"role": "leader"}}
    response = await client.post("/api/v1/commands", json=bad_role, headers=operator_headers)
    assert response.status_code == 422
    assert any("role" in entry["loc"] for entry in response.json()["detail"])
    duplicate = {
        "kind": "set_pool_membership",
        "target": MEMBER,
        "payload": {"pool": "decode", "instances": ["http://a", "http://a"]},
    }
    response = await client.post("/api/v1/commands", json=duplicate, headers=operator_headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "payload", "instances"]
    assert "http://a" in response.json()["detail"][0]["msg"]
    unknown = await client.post("/api/v1/commands", json=drain("nobody"), headers=operator_headers)
    assert unknown.status_code == 404 and "nobody" in unknown.json()["detail"]


async def test_list_filters_and_pages(
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    viewer_headers: dict[str, str],
    agent_headers: dict[str, str],
) -> None:
    policy = {
        "version": 3,
        "ttl_s": 30.0,
        "fallback_max_concurrency": 64,
        "classes": {"interactive": {"shed_order": 1, "sheddable": True, "ttft_s": 0.5}},
    }
    await issue(
        client,
        operator_headers,
        {"kind": "set_admission_policy", "target": OTHER, "payload": {"policy": policy}},
    )
    mine = [await issue(client, operator_headers, drain()) for _ in range(3)]
    await poll(client, agent_headers)

    async def listed(**params: Any) -> dict[str, Any]:
        response = await client.get("/api/v1/commands", params=params, headers=viewer_headers)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    assert (await listed())["count"] == 4
    page = await listed(target=MEMBER, limit=2, offset=1)
    assert page["count"] == 3
    assert [c["id"] for c in page["data"]] == [mine[1]["id"], mine[0]["id"]]
    assert (await listed(state="delivered"))["count"] == 3
    other = await listed(target=OTHER, state="pending")
    assert other["count"] == 1 and other["data"][0]["payload"] == {"policy": policy}
    missing = await client.get(f"/api/v1/commands/{uuid.uuid4()}", headers=viewer_headers)
    assert missing.status_code == 404
    forbidden = await client.post("/api/v1/commands", json=drain(), headers=viewer_headers)
    assert forbidden.status_code == 403


async def test_issue_and_ack_are_audited(
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    admin_headers: dict[str, str],
    agent_headers: dict[str, str],
) -> None:
    created = await issue(client, operator_headers, drain())
    await poll(client, agent_headers)
    path = f"/api/v1/fleet/{MEMBER}/commands/{created['id']}/ack"
    for _ in range(2):
        await client.post(path, json=ack_of(created["id"]), headers=agent_headers)
    response = await client.get(
        "/api/v1/audit", params={"target_type": "command"}, headers=admin_headers
    )
    entries = response.json()["data"]
    assert sorted(e["action"] for e in entries) == ["command.ack", "command.issue"]
    by_action = {e["action"]: e for e in entries}
    assert by_action["command.issue"]["actor"].endswith(":test-operator")
    assert by_action["command.issue"]["after"]["state"] == "pending"
    assert by_action["command.ack"]["actor"].endswith(":test-agent")
    assert by_action["command.ack"]["before"]["state"] == "delivered"
    assert by_action["command.ack"]["after"]["state"] == "acked"
    assert all(e["target_id"] == created["id"] for e in entries)


async def test_real_agent_over_loopback(
    app: FastAPI, client: httpx.AsyncClient, operator_headers: dict[str, str], make_key: MakeKey
) -> None:
    key = await make_key(KeyRole.AGENT, name="loopback-agent")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    applied: list[tuple[CommandKind, dict[str, Any]]] = []

    def apply(kind: CommandKind, payload: Mapping[str, Any]) -> str:
        applied.append((kind, dict(payload)))
        return "done"

    settings = AgentSettings(
        url=f"http://127.0.0.1:{port}", member_id=MEMBER, endpoint=f"http://{MEMBER}", key=key
    )
    agent = Agent(settings, report=lambda: AgentReport("both", "ready", {}), apply=apply)
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.02)
        assert server.started
        await asyncio.to_thread(agent.step)  # registers; nothing to run yet
        created = await issue(
            client,
            operator_headers,
            {"kind": "set_role", "target": MEMBER, "payload": {"role": "prefill"}},
        )
        await asyncio.to_thread(agent.step)
        assert applied == [(CommandKind.SET_ROLE, {"role": "prefill"})]
        assert agent.stats().commands_supported is True
        read = await client.get(f"/api/v1/commands/{created['id']}", headers=operator_headers)
        assert read.json()["state"] == "acked"
        assert read.json()["ack"]["detail"] == "done"
    finally:
        await asyncio.to_thread(agent.stop)
        server.should_exit = True
        await serving


def command_counts(text: str) -> dict[tuple[str, str], float]:
    """``goodput_commands_total`` samples of a /metrics text, by ``(kind, state)``."""
    pattern = re.compile(r'^goodput_commands_total\{kind="([a-z_]+)",state="([a-z]+)"\} (\S+)$')
    found = (pattern.match(line) for line in text.splitlines())
    return {(m[1], m[2]): float(m[3]) for m in found if m}


async def test_metrics_count_commands_by_kind_and_state(
    client: httpx.AsyncClient, operator_headers: dict[str, str], agent_headers: dict[str, str]
) -> None:
    before = command_counts((await client.get("/metrics", headers=operator_headers)).text)
    # Every kind and state from the start (counters at 0 until something happens).
    assert len(before) == len(CommandKind) * len(CommandState)
    acked = await issue(client, operator_headers, drain())
    refused = await issue(client, operator_headers, {"kind": "resume", "target": MEMBER})
    await issue(client, operator_headers, drain(target=OTHER, ttl_s=0.001))
    await asyncio.sleep(0.01)
    assert len(await poll(client, agent_headers)) == 2
    assert await poll(client, agent_headers, OTHER) == []  # expired at this poll
    for command, ok in ((acked, True), (refused, False)):
        path = f"/api/v1/fleet/{MEMBER}/commands/{command['id']}/ack"
        response = await client.post(path, json=ack_of(command["id"], ok=ok), headers=agent_headers)
        assert response.status_code == 200, response.text
    # A refused issue (unknown target) rolls back and counts nothing.
    response = await client.post("/api/v1/commands", json=drain(target="nobody:1"),
                                 headers=operator_headers)  # fmt: skip
    assert response.status_code == 404
    after = command_counts((await client.get("/metrics", headers=operator_headers)).text)
    delta = {key: after[key] - before[key] for key in after if after[key] != before[key]}
    assert delta == {
        ("drain", "pending"): 2,
        ("resume", "pending"): 1,
        ("drain", "delivered"): 1,
        ("resume", "delivered"): 1,
        ("drain", "expired"): 1,
        ("drain", "acked"): 1,
        ("resume", "failed"): 1,
    }
