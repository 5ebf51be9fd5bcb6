"""Tenancy and agents (issue 15): a tenant-scoped key reaches its tenant's SLOs, and of the
fleet only the members registered with its tenant (their commands, pins and moves); the
planner's switch and a tick now stay with cluster keys; an agent key acts only for the
members it registered. Every row of the matrix in docs/api.md ("Tenant scope")."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import pytest_asyncio
import sqlalchemy as sa
from fastapi import FastAPI

from controlplane.models import Command, RolePin
from controlplane.services import automation
from tests.integration.controlplane.conftest import MakeKey, bearer
from tests.integration.controlplane.test_fleet_registry import WORKER as FLEET_WORKER

pytestmark = pytest.mark.integration

WORKER = {**FLEET_WORKER, "id": "worker-a"}
AUTOMATION = "/api/v1/automation"
# Members: two of tenant acme, one of the cluster (shared), one of tenant beta.
TENANTS = {"acme-0": "acme", "acme-1": "acme", "shared-0": None, "beta-0": "beta"}
OTHERS = ("shared-0", "beta-0")
NOT_FOUND = "fleet member {!r} not found; register it first"
WHOSE = {
    "shared-0": "the cluster's (shared, registered without a tenant)",
    "beta-0": "another tenant's",
}
CLUSTER_ONLY = (
    "this route acts on the whole cluster (the planner's pause, resume and tick); key "
    "'acme-operator' is scoped to tenant 'acme'"
)


def refused(member: str, key: str = "acme-operator") -> dict[str, str]:
    return {
        "detail": f"fleet member {member!r} is {WHOSE[member]}; key {key!r} is scoped to "
        "tenant 'acme' and acts only on that tenant's members"
    }


def _member(member_id: str) -> dict[str, Any]:
    body: dict[str, Any] = {**FLEET_WORKER, "id": member_id, "state": "ready"}
    if TENANTS[member_id] is not None:
        body["tenant"] = TENANTS[member_id]
    return body


class Fleet:
    """The members of :data:`TENANTS`, registered by one agent key; an admin issued one
    command to each, moved ``acme-0``, ``shared-0`` and ``beta-0`` (a drain each) and
    pinned them."""

    def __init__(self) -> None:
        self.commands: dict[str, str] = {}
        self.moves: dict[str, str] = {}


@pytest_asyncio.fixture(loop_scope="function")
async def fleet(
    client: httpx.AsyncClient, make_key: MakeKey, admin_headers: dict[str, str]
) -> Fleet:
    agent = bearer(await make_key("agent", name="host-agent"))
    world = Fleet()
    for member_id, tenant in TENANTS.items():
        response = await client.post(
            "/api/v1/fleet/register", json=_member(member_id), headers=agent
        )
        assert response.status_code == 200, response.text
        assert response.json()["tenant"] == tenant
        issued = await client.post(
            "/api/v1/commands",
            json={"kind": "set_role", "target": member_id, "payload": {"role": "decode"}},
            headers=admin_headers,
        )
        assert issued.status_code == 201, issued.text
        world.commands[member_id] = issued.json()["id"]
    for member_id in ("acme-0", *OTHERS):
        move = await client.post(
            f"{AUTOMATION}/moves",
            json={"member_id": member_id, "role": "prefill"},
            headers=admin_headers,
        )
        assert move.status_code == 201, move.text
        world.moves[member_id] = move.json()["id"]
        pin = await client.put(
            f"{AUTOMATION}/pins/{member_id}", json={"role": "decode"}, headers=admin_headers
        )
        assert pin.status_code == 201, pin.text
    return world


@pytest_asyncio.fixture(loop_scope="function")
async def acme_viewer(make_key: MakeKey) -> dict[str, str]:
    return bearer(await make_key("viewer", tenant="acme", name="acme-viewer"))


@pytest_asyncio.fixture(loop_scope="function")
async def acme_operator(make_key: MakeKey) -> dict[str, str]:
    return bearer(await make_key("operator", tenant="acme", name="acme-operator"))


@pytest_asyncio.fixture(loop_scope="function")
async def cluster_viewer(make_key: MakeKey) -> dict[str, str]:
    return bearer(await make_key("viewer", name="cluster-viewer"))


async def test_a_tenant_key_lists_and_reads_only_its_tenants_members(
    client: httpx.AsyncClient,
    fleet: Fleet,
    acme_viewer: dict[str, str],
    acme_operator: dict[str, str],
    cluster_viewer: dict[str, str],
) -> None:
    """Regression: a tenant viewer read every tenant's fleet."""
    for headers in (acme_viewer, acme_operator):
        listed = (await client.get("/api/v1/fleet", headers=headers)).json()
        assert [(m["id"], m["tenant"]) for m in listed["data"]] == [
            ("acme-0", "acme"),
            ("acme-1", "acme"),
        ]
        assert listed["count"] == 2
        filtered = await client.get("/api/v1/fleet", params={"role": "decode"}, headers=headers)
        assert filtered.json()["count"] == 2
        own = await client.get("/api/v1/fleet/acme-1", headers=headers)
        assert (own.status_code, own.json()["tenant"]) == (200, "acme")
        for member_id in OTHERS:
            other = await client.get(f"/api/v1/fleet/{member_id}", headers=headers)
            assert (other.status_code, other.json()) == (
                404,
                {"detail": NOT_FOUND.format(member_id)},
            )
    everything = (await client.get("/api/v1/fleet", headers=cluster_viewer)).json()
    assert {m["id"]: m["tenant"] for m in everything["data"]} == TENANTS
    assert everything["count"] == 4
    shared = await client.get("/api/v1/fleet/beta-0", headers=cluster_viewer)
    assert shared.status_code == 200


async def test_a_tenant_key_reads_only_its_members_commands(
    client: httpx.AsyncClient,
    fleet: Fleet,
    acme_viewer: dict[str, str],
    cluster_viewer: dict[str, str],
) -> None:
    """Regression: a tenant viewer read every tenant's commands."""
    listed = (await client.get("/api/v1/commands", headers=acme_viewer)).json()
    # Its members' own commands and the drain of acme-0's move; nothing of the others.
    assert {c["target"] for c in listed["data"]} == {"acme-0", "acme-1"}
    assert listed["count"] == 3
    for member_id in OTHERS:
        filtered = await client.get(
            "/api/v1/commands", params={"target": member_id}, headers=acme_viewer
        )
        assert filtered.json() == {"data": [], "count": 0}
        command_id = fleet.commands[member_id]
        other = await client.get(f"/api/v1/commands/{command_id}", headers=acme_viewer)
        assert (other.status_code, other.json()) == (
            404,
            {"detail": f"command {command_id!r} not found"},
        )
        seen = await client.get(f"/api/v1/commands/{command_id}", headers=cluster_viewer)
        assert seen.status_code == 200
    own = await client.get(f"/api/v1/commands/{fleet.commands['acme-0']}", headers=acme_viewer)
    assert (own.status_code, own.json()["target"]) == (200, "acme-0")
    everything = (await client.get("/api/v1/commands", headers=cluster_viewer)).json()
    assert everything["count"] == 7


async def test_a_tenant_key_reads_only_its_members_pins_and_moves(
    client: httpx.AsyncClient,
    fleet: Fleet,
    acme_viewer: dict[str, str],
    cluster_viewer: dict[str, str],
) -> None:
    """Regression: a tenant viewer read every member's pins and moves."""
    moves = (await client.get(f"{AUTOMATION}/moves", headers=acme_viewer)).json()
    assert ([m["member_id"] for m in moves["data"]], moves["count"]) == (["acme-0"], 1)
    own = await client.get(f"{AUTOMATION}/moves/{fleet.moves['acme-0']}", headers=acme_viewer)
    assert (own.status_code, own.json()["member_id"]) == (200, "acme-0")
    for member_id in OTHERS:
        filtered = await client.get(
            f"{AUTOMATION}/moves", params={"member_id": member_id}, headers=acme_viewer
        )
        assert filtered.json() == {"data": [], "count": 0}
        move_id = fleet.moves[member_id]
        other = await client.get(f"{AUTOMATION}/moves/{move_id}", headers=acme_viewer)
        assert (other.status_code, other.json()) == (
            404,
            {"detail": f"role move {move_id!r} not found"},
        )
    pins = (await client.get(f"{AUTOMATION}/pins", headers=acme_viewer)).json()
    assert [p["member_id"] for p in pins] == ["acme-0"]
    status = (await client.get(AUTOMATION, headers=acme_viewer)).json()
    assert [p["member_id"] for p in status["pins"]] == ["acme-0"]
    assert status["open_moves"] == 1
    assert status["planner"]["paused"] is False  # the switch is the fleet's: shown as is
    everything = (await client.get(AUTOMATION, headers=cluster_viewer)).json()
    assert [p["member_id"] for p in everything["pins"]] == ["acme-0", "beta-0", "shared-0"]
    assert everything["open_moves"] == 3
    all_moves = (await client.get(f"{AUTOMATION}/moves", headers=cluster_viewer)).json()
    assert all_moves["count"] == 3


async def test_of_the_moves_a_tick_started_a_tenant_key_sees_its_own(
    app: FastAPI, fleet: Fleet
) -> None:
    """``GET /automation``'s ``last_tick.moves_started``, as a tenant key reads it."""
    started = [uuid.UUID(fleet.moves[m]) for m in ("beta-0", "acme-0", "shared-0")]
    started.append(uuid.uuid4())  # a move since gone
    async with app.state.sessions() as session:
        ours = await automation.tenant_moves(session, started, tenant="acme")
        none = await automation.tenant_moves(session, started, tenant="gamma")
    assert (ours, none) == ([uuid.UUID(fleet.moves["acme-0"])], [])


async def test_a_tenant_operator_acts_only_on_its_tenants_members(
    app: FastAPI,
    client: httpx.AsyncClient,
    fleet: Fleet,
    acme_operator: dict[str, str],
    operator_headers: dict[str, str],
) -> None:
    """Regression: a tenant operator key could issue commands to and pin any member."""
    drain = {"kind": "drain", "target": "acme-1"}
    issued = await client.post("/api/v1/commands", json=drain, headers=acme_operator)
    assert (issued.status_code, issued.json()["target"]) == (201, "acme-1")
    unknown = await client.post(
        "/api/v1/commands", json={**drain, "target": "nobody"}, headers=acme_operator
    )
    assert (unknown.status_code, unknown.json()) == (404, {"detail": NOT_FOUND.format("nobody")})
    pinned = await client.put(
        f"{AUTOMATION}/pins/acme-1", json={"role": "decode"}, headers=acme_operator
    )
    assert pinned.status_code == 201, pinned.text
    unpinned = await client.delete(f"{AUTOMATION}/pins/acme-1", headers=acme_operator)
    assert unpinned.status_code == 204
    moved = await client.post(
        f"{AUTOMATION}/moves",
        json={"member_id": "acme-1", "role": "prefill"},
        headers=acme_operator,
    )
    assert (moved.status_code, moved.json()["member_id"]) == (201, "acme-1")
    async with app.state.sessions() as session:
        commands_before = await session.scalar(sa.select(sa.func.count()).select_from(Command))
    for member_id in OTHERS:
        for method, path, body in (
            ("POST", "/api/v1/commands", {**drain, "target": member_id}),
            ("PUT", f"{AUTOMATION}/pins/{member_id}", {"role": "prefill"}),
            ("DELETE", f"{AUTOMATION}/pins/{member_id}", None),
            ("POST", f"{AUTOMATION}/moves", {"member_id": member_id, "role": "decode"}),
        ):
            response = await client.request(method, path, json=body, headers=acme_operator)
            assert (response.status_code, response.json()) == (403, refused(member_id)), path
    async with app.state.sessions() as session:
        assert await session.scalar(sa.select(sa.func.count()).select_from(Command)) == (
            commands_before
        )
        pins = {p.member_id: p.role.value for p in await session.scalars(sa.select(RolePin))}
    assert pins == {"acme-0": "decode", "shared-0": "decode", "beta-0": "decode"}
    # A cluster key still acts on every member.
    for member_id in OTHERS:
        cluster = await client.post(
            "/api/v1/commands", json={**drain, "target": member_id}, headers=operator_headers
        )
        assert cluster.status_code == 201, cluster.text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", f"{AUTOMATION}/pause"),
        ("POST", f"{AUTOMATION}/resume"),
        ("POST", f"{AUTOMATION}/tick"),
    ],
)
async def test_the_planners_switch_and_tick_stay_with_cluster_keys(
    client: httpx.AsyncClient, acme_operator: dict[str, str], method: str, path: str
) -> None:
    """Regression: a tenant operator key could pause and resume the whole automation."""
    body = None if path.endswith("tick") else {"reason": "x"}
    response = await client.request(method, path, json=body, headers=acme_operator)
    assert (response.status_code, response.json()) == (403, {"detail": CLUSTER_ONLY})


@pytest.mark.parametrize("tenant", ["", "a" * 201, "ac\x00me", 7])
async def test_a_bad_tenant_is_refused_naming_the_field(
    client: httpx.AsyncClient, make_key: MakeKey, tenant: object
) -> None:
    """Validated as a key's tenant: 1 to 200 characters, no NUL."""
    agent = bearer(await make_key("agent"))
    body = {**WORKER, "tenant": tenant}
    response = await client.post("/api/v1/fleet/register", json=body, headers=agent)
    assert response.status_code == 422, response.text
    (entry,) = response.json()["detail"]
    assert entry["loc"] == ["body", "tenant"]
    assert entry["msg"].startswith("tenant "), entry


async def test_registering_again_moves_a_member_to_another_tenant(
    client: httpx.AsyncClient, make_key: MakeKey, acme_viewer: dict[str, str]
) -> None:
    """The tenant is the agent's to say, as the endpoint is: registering again replaces it
    (only the key that registered the member may)."""
    agent = bearer(await make_key("agent"))
    for tenant, listed in (("acme", ["worker-a"]), (None, [])):
        body = {**WORKER, "tenant": tenant}
        response = await client.post("/api/v1/fleet/register", json=body, headers=agent)
        assert (response.status_code, response.json()["tenant"]) == (200, tenant)
        page = (await client.get("/api/v1/fleet", headers=acme_viewer)).json()
        assert [m["id"] for m in page["data"]] == listed


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
