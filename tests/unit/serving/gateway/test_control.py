"""The gateway's link to the control plane (fleet sync, registration) and its config."""

from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.sinks import InMemorySink
from serving.gateway import Gateway, GatewayConfig, GatewayConfigError, PoolRole
from serving.gateway.control import ControlPlaneLink

CP = "http://cp:8000"


class FakeControlPlane:
    def __init__(self) -> None:
        self.members: list[dict] = []
        self.down = False
        self.forget = False
        self.calls: list[tuple[str, str, str | None]] = []
        self.bodies: list[dict] = []
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("refused", request=request)
        self.calls.append((request.method, request.url.path, request.headers.get("authorization")))
        if request.url.path == "/api/v1/fleet":
            offset = int(request.url.params["offset"])
            page = self.members[offset : offset + 1]  # one per page: paging is exercised
            return httpx.Response(200, json={"data": page, "count": len(self.members)})
        self.bodies.append(json.loads(request.content))
        if request.url.path.endswith("/heartbeat") and self.forget:
            self.forget = False
            return httpx.Response(404, json={"detail": "not found"})
        return httpx.Response(200, json={})


def link(cp: FakeControlPlane, **config: object) -> tuple[Gateway, ControlPlaneLink]:
    gateway = Gateway(
        GatewayConfig(control_plane=CP, gateway_id="gw-1", **config),  # type: ignore[arg-type]
        sink=InMemorySink(),
        registry=CollectorRegistry(),
    )
    return gateway, ControlPlaneLink(gateway, transport=cp.transport)


def worker(endpoint: str, role: str) -> dict:
    return {"id": endpoint, "kind": "worker", "endpoint": endpoint, "role": role,
            "state": "ready", "stale": False}  # fmt: skip


async def test_fleet_sync_fills_the_pools_and_keeps_them_when_the_control_plane_is_down() -> None:
    cp = FakeControlPlane()
    cp.members = [worker("http://p:1", "prefill"), worker("http://d:1", "decode")]
    gateway, control = link(cp, viewer_key="view", agent_key="agent")
    assert await control.sync_fleet()
    roles = {s.id: s.role for s in gateway.pool.states()}
    assert roles == {"http://p:1": PoolRole.PREFILL, "http://d:1": PoolRole.DECODE}
    assert cp.calls[0] == ("GET", "/api/v1/fleet", "Bearer view")
    assert len(cp.calls) == 2  # two pages of one member
    cp.down = True
    assert not await control.sync_fleet()
    assert {s.id for s in gateway.pool.states()} == set(roles)
    assert gateway.registry.get_sample_value("goodput_gateway_fleet_refresh_failures_total") == 1
    await control.stop()


async def test_registers_beats_and_registers_again_when_forgotten() -> None:
    cp = FakeControlPlane()
    _, control = link(cp, agent_key="agent", port=9000)
    assert await control.beat()
    assert await control.beat()
    cp.forget = True
    assert await control.beat()
    paths = [path for _, path, _ in cp.calls]
    assert paths == [
        "/api/v1/fleet/register",
        "/api/v1/fleet/gw-1/heartbeat",
        "/api/v1/fleet/gw-1/heartbeat",
        "/api/v1/fleet/register",
    ]
    assert cp.bodies[0] == {"id": "gw-1", "kind": "gateway", "endpoint": "http://127.0.0.1:9000",
                            "model": "",
                            "role": "both", "state": "ready", "load": {"in_flight": 0}}  # fmt: skip
    assert all(auth == "Bearer agent" for _, _, auth in cp.calls)
    cp.down = True
    assert not await control.beat()
    await control.stop()


async def test_registers_with_the_tenant_whose_pool_it_serves() -> None:
    cp = FakeControlPlane()
    _, control = link(cp, agent_key="agent", fleet_tenant="acme")
    assert await control.beat()
    assert cp.bodies[0]["tenant"] == "acme"
    await control.stop()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "no upstream: give --prefill and --decode URLs, --colocated URLs, or --control-plane"),
        ({"prefill": ("http://p:1",)}, "PD mode needs both pools: got 1 --prefill and 0 --decode"),
        ({"colocated": ("http://a:1",), "decode": ("http://d:1",)},
         "--colocated cannot be combined with --prefill/--decode"),
        ({"colocated": ("http://a:1",), "chunk_timeout_s": 0.0},
         "chunk_timeout_s must be a finite number > 0, got 0.0"),
        ({"colocated": ("http://a:1",), "port": 70000}, "port must be in 0..65535, got 70000"),
        ({"control_plane": "cp:8000"},
         "--control-plane must start with http:// or https://, got 'cp:8000'"),
    ],
)  # fmt: skip
def test_config_errors_name_the_option(kwargs: dict, message: str) -> None:
    with pytest.raises(GatewayConfigError) as info:
        GatewayConfig(**kwargs)
    assert str(info.value).startswith(message)
