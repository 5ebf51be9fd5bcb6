"""The worker's agent against scripted control-plane answers (httpx.MockTransport)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

import httpx

from exporters.commands import Command, CommandKind, command_to_json
from exporters.fleet import FleetState, PoolRole
from serving.workers import Agent, AgentReport, AgentSettings

MEMBER = "127.0.0.1:8100"
SETTINGS = AgentSettings(
    url="http://cp:8000",
    member_id=MEMBER,
    endpoint="http://127.0.0.1:8100",
    key="gp_agent",
    model="tiny",
    heartbeat_interval_s=5.0,
    backoff_initial_s=1.0,
    backoff_max_s=8.0,
)


class FakeControlPlane:
    """The fleet routes, plus the command routes when ``commands`` is not None."""

    def __init__(self, commands: list[Command] | None = None) -> None:
        self.members: dict[str, dict[str, Any]] = {}
        self.commands = commands
        self.acks: list[dict[str, Any]] = []
        self.requests: list[str] = []
        self.down = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        assert request.headers["Authorization"] == "Bearer gp_agent"
        path = request.url.path
        self.requests.append(f"{request.method} {path}")
        body: Any = json.loads(request.content) if request.content else None
        base = f"/api/v1/fleet/{MEMBER}"
        if path == "/api/v1/fleet/register":
            self.members[body["id"]] = body
            return httpx.Response(200, json=body)
        if path == f"{base}/heartbeat":
            if MEMBER not in self.members:
                return httpx.Response(404, json={"detail": "not found"})
            self.members[MEMBER].update(body)
            return httpx.Response(200, json=self.members[MEMBER])
        if path == f"{base}/commands" and self.commands is not None:
            data = [command_to_json(c) for c in self.commands]
            return httpx.Response(200, json={"data": data, "count": len(data)})
        if path.startswith(f"{base}/commands/") and path.endswith("/ack"):
            self.acks.append(body)
            if self.commands is not None:
                self.commands = [c for c in self.commands if c.id != body["command_id"]]
            return httpx.Response(204)
        return httpx.Response(404, json={"detail": "Not Found"})


class Worker:
    def __init__(self) -> None:
        self.role = "prefill"
        self.applied: list[CommandKind] = []

    def report(self) -> AgentReport:
        role, state = PoolRole(self.role), FleetState.READY
        return AgentReport(role=role, state=state, load={"num_requests_running": 1})

    def apply(self, kind: CommandKind, payload: Mapping[str, Any]) -> str:
        self.applied.append(kind)
        if kind is CommandKind.SET_ROLE:
            self.role = payload["role"]
        return "done"


def agent(plane: FakeControlPlane, worker: Worker) -> Agent:
    return Agent(
        SETTINGS, report=worker.report, apply=worker.apply, transport=httpx.MockTransport(plane)
    )


def test_registers_then_beats_with_state_and_load() -> None:
    plane, worker = FakeControlPlane(), Worker()
    a = agent(plane, worker)

    assert a.step() == 5.0
    assert a.step() == 5.0

    assert plane.members[MEMBER] == {
        "id": MEMBER,
        "kind": "worker",
        "endpoint": "http://127.0.0.1:8100",
        "model": "tiny",
        "role": "prefill",
        "state": "ready",
        "load": {"num_requests_running": 1},
    }
    stats = a.stats()
    assert (stats.registered, stats.num_registrations, stats.num_heartbeats) == (True, 1, 1)
    assert stats.commands_supported is False  # the command route answered 404


def test_registers_with_the_tenant_whose_pool_it_serves() -> None:
    plane, worker = FakeControlPlane(), Worker()
    settings = dataclasses.replace(SETTINGS, tenant="acme")
    a = Agent(
        settings, report=worker.report, apply=worker.apply, transport=httpx.MockTransport(plane)
    )

    a.step()

    assert plane.members[MEMBER]["tenant"] == "acme"


def test_registers_again_when_forgotten_or_when_the_role_changes() -> None:
    plane, worker = FakeControlPlane(), Worker()
    a = agent(plane, worker)
    a.step()

    plane.members.clear()  # the control plane lost its registry
    a.step()
    worker.role = "decode"
    a.step()

    assert plane.members[MEMBER]["role"] == "decode"
    assert a.stats().num_registrations == 3


def test_an_unreachable_control_plane_backs_off_and_never_raises() -> None:
    plane, worker = FakeControlPlane(), Worker()
    a = agent(plane, worker)
    plane.down = True

    delays = [a.step() for _ in range(5)]

    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert a.stats().num_failures == 5
    assert not a.stats().registered
    plane.down = False
    assert a.step() == 5.0
    assert a.stats().registered


def test_a_server_error_is_retried_like_an_outage() -> None:
    worker = Worker()

    def failing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="busy")

    a = Agent(
        SETTINGS, report=worker.report, apply=worker.apply, transport=httpx.MockTransport(failing)
    )

    assert a.step() == 1.0
    assert a.stats().num_failures == 1


def test_commands_are_polled_applied_and_acknowledged() -> None:
    now = time.time_ns()
    role = Command.new(
        CommandKind.SET_ROLE, MEMBER, {"role": "decode"}, version=2, now_ns=now, ttl_s=60
    )
    drain = Command.new(CommandKind.DRAIN, MEMBER, {}, version=1, now_ns=now, ttl_s=60)
    plane, worker = FakeControlPlane(commands=[role, drain]), Worker()
    a = agent(plane, worker)

    a.step()  # registers as prefill, applies both commands, registers again as decode

    assert plane.members[MEMBER]["role"] == "decode"  # in the same step
    assert a.stats().num_registrations == 2
    a.step()  # a heartbeat: the role did not change since
    assert a.stats().num_registrations == 2
    assert worker.applied == [CommandKind.SET_ROLE, CommandKind.DRAIN]
    assert [(ack["command_id"], ack["ok"], ack["target"]) for ack in plane.acks] == [
        (role.id, True, MEMBER),
        (drain.id, True, MEMBER),
    ]
    assert plane.members[MEMBER]["role"] == "decode"
    assert a.stats().commands_supported is True
    assert a.stats().num_commands == 2


def test_a_malformed_command_is_skipped() -> None:
    plane, worker = FakeControlPlane(commands=[]), Worker()
    original = plane.__call__

    def with_garbage(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/commands"):
            return httpx.Response(200, json={"data": [{"v": 1, "kind": "reboot"}], "count": 1})
        return original(request)

    a = Agent(
        SETTINGS,
        report=worker.report,
        apply=worker.apply,
        transport=httpx.MockTransport(with_garbage),
    )

    assert a.step() == 5.0
    assert worker.applied == []
    assert plane.acks == []
