"""The gateway's command link: admission policies polled, applied once, acknowledged."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from exporters.admission import AdmissionPolicy, ClassPolicy
from exporters.commands import Command, CommandKind, command_to_json
from exporters.sinks import InMemorySink
from serving.gateway import Gateway, GatewayConfig
from serving.gateway.admission_policy import PolicyAdmission
from serving.gateway.control import ControlPlaneLink

CP = "http://cp:8000"


class FakeCommands:
    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.acks: list[dict[str, Any]] = []
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer agent"
        if request.method == "GET" and request.url.path == "/api/v1/fleet/gw-1/commands":
            return httpx.Response(200, json={"data": self.pending, "count": len(self.pending)})
        if request.method == "POST" and request.url.path.endswith("/ack"):
            self.acks.append(json.loads(request.content))
            return httpx.Response(200, json={})
        return httpx.Response(404, json={"detail": "not found"})


def policy(version: int) -> AdmissionPolicy:
    return AdmissionPolicy(
        version=version,
        ttl_s=30,
        fallback_max_concurrency=8,
        classes={"batch": ClassPolicy(shed_order=0, headroom_ratio=0.5)},
    )


def command(
    kind: CommandKind,
    payload: dict[str, Any],
    *,
    target: str = "gw-1",
    version: int = 1,
    now_ns: int | None = None,
) -> dict[str, Any]:
    now = time.time_ns() if now_ns is None else now_ns
    cmd = Command.new(kind, target, payload, version=version, now_ns=now, ttl_s=60.0)
    return command_to_json(cmd)


def setup() -> tuple[Gateway, ControlPlaneLink, FakeCommands, PolicyAdmission]:
    cp = FakeCommands()
    gateway = Gateway(
        GatewayConfig(control_plane=CP, gateway_id="gw-1", agent_key="agent"),
        sink=InMemorySink(),
        registry=CollectorRegistry(),
    )
    rule = PolicyAdmission(gateway.load, clock_s=gateway.clock_s)
    gateway.admission = rule
    return gateway, ControlPlaneLink(gateway, transport=cp.transport), cp, rule


async def test_policies_are_applied_once_and_every_delivery_is_acked() -> None:
    _, link, cp, rule = setup()
    first = command(CommandKind.SET_ADMISSION_POLICY, {"policy": policy(3)}, version=3)
    cp.pending = [first, command(CommandKind.SET_ROLE, {"role": "decode"})]
    assert await link.poll_commands() == 2
    assert rule.policy == policy(3) and rule.mode() == "policy"
    ok, refused = cp.acks
    assert (ok["command_id"], ok["ok"], ok["target"]) == (first["id"], True, "gw-1")
    assert ok["detail"] == "admission policy version 3 applied (ttl 30 s)"
    assert refused["ok"] is False
    assert refused["detail"] == (
        "kind 'set_role' is not supported by this gateway; allowed: ['set_admission_policy']"
    )
    # A redelivery gets the first answer again and applies nothing.
    applied_at = rule.applied_s
    cp.pending, cp.acks = [first], []
    assert await link.poll_commands() == 1
    assert cp.acks[0]["ok"] is True and rule.applied_s == applied_at
    assert (link.num_commands_applied, link.num_commands_refused) == (1, 1)
    await link.stop()


async def test_stale_expired_and_misaddressed_policies_are_refused() -> None:
    _, link, cp, rule = setup()
    past = time.time_ns() - 120 * 10**9
    cp.pending = [
        command(CommandKind.SET_ADMISSION_POLICY, {"policy": policy(5)}, version=5),
        command(CommandKind.SET_ADMISSION_POLICY, {"policy": policy(4)}, version=4),
        command(CommandKind.SET_ADMISSION_POLICY, {"policy": policy(6)}, now_ns=past),
        command(CommandKind.SET_ADMISSION_POLICY, {"policy": policy(7)}, target="gw-2"),
    ]
    assert await link.poll_commands() == 4
    assert [a["ok"] for a in cp.acks] == [True, False, False, False]
    assert [a["detail"] for a in cp.acks[1:]] == [
        "stale: policy version 4 < applied version 5",
        "expired",
        "wrong target 'gw-2': this gateway is 'gw-1'",
    ]
    assert rule.policy is not None and rule.policy.version == 5
    await link.stop()


async def test_a_hook_without_policies_refuses_them_and_a_dead_control_plane_is_survived() -> None:
    cp = FakeCommands()
    gateway = Gateway(
        GatewayConfig(control_plane=CP, gateway_id="gw-1", agent_key="agent"),
        sink=InMemorySink(),
        registry=CollectorRegistry(),
    )  # its hook is AllowAll
    link = ControlPlaneLink(gateway, transport=cp.transport)
    cp.pending = [command(CommandKind.SET_ADMISSION_POLICY, {"policy": policy(1)})]
    await link.poll_commands()
    assert cp.acks[0]["detail"] == "this gateway's admission hook (AllowAll) takes no policy"
    down = ControlPlaneLink(
        gateway, transport=httpx.MockTransport(lambda r: httpx.Response(503, json={}))
    )
    assert await down.poll_commands() == 0
    await link.stop()
    await down.stop()
