"""``pools_from``: the gateway's membership source, fleet registry or Kubernetes labels.

With ``kubernetes`` the control-plane link stops reading the fleet registry (two membership
sources would drop each other's members) but still registers the gateway, beats and polls
its commands; the config needs no other upstream.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from exporters.sinks import InMemorySink
from serving.gateway import Gateway, GatewayConfig, GatewayConfigError
from serving.gateway.config import PoolSource
from serving.gateway.control import ControlPlaneLink
from tests.unit.serving.gateway.test_control import CP, FakeControlPlane, worker


def test_kubernetes_is_an_upstream_of_its_own_and_turns_the_fleet_sync_off() -> None:
    config = GatewayConfig(pools_from="kubernetes")  # type: ignore[arg-type]
    assert config.pools_from is PoolSource.KUBERNETES
    assert not config.fleet_sync
    assert not GatewayConfig(control_plane=CP, pools_from=PoolSource.KUBERNETES).fleet_sync
    assert GatewayConfig(control_plane=CP).fleet_sync  # the default: the fleet registry
    assert GatewayConfig(prefill=("http://p:1",), pools_from=PoolSource.KUBERNETES).prefill


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"pools_from": "labels"}, "pools_from must be one of 'fleet', 'kubernetes'"),
        ({"worker_port": 0}, "worker_port must be in 1..65535, got 0"),
        ({"kubernetes_selector": " "}, "--kubernetes-selector must not be empty"),
        ({"kubernetes_api": "api:6443"}, "--kubernetes-api must start with http://"),
    ],
)
def test_bad_kubernetes_settings_are_refused(values: dict[str, object], message: str) -> None:
    with pytest.raises(GatewayConfigError, match=message):
        GatewayConfig(**{"pools_from": PoolSource.KUBERNETES, **values})  # type: ignore[arg-type]


async def test_with_kubernetes_the_link_beats_and_polls_but_never_reads_the_fleet() -> None:
    cp = FakeControlPlane()
    cp.members = [worker("http://p:1", "prefill")]
    config = GatewayConfig(control_plane=CP, gateway_id="gw-1", agent_key="agent",
                           pools_from=PoolSource.KUBERNETES, command_poll_s=0.05)  # fmt: skip
    gateway = Gateway(config, sink=InMemorySink(), registry=CollectorRegistry())
    link = ControlPlaneLink(gateway, transport=cp.transport)
    link.start()
    try:
        for _ in range(500):
            if sum(path.endswith("/commands") for _, path, _ in cp.calls) >= 2:
                break
            await asyncio.sleep(0.01)
        paths = [path for _, path, _ in cp.calls]
        assert "/api/v1/fleet/register" in paths
        assert sum(p.endswith("/commands") for p in paths) >= 2
        assert "/api/v1/fleet" not in paths
        assert link.num_fleet_syncs == 0 and len(gateway.pool) == 0
    finally:
        await link.stop()


async def test_with_kubernetes_and_no_agent_key_the_link_idles_until_stopped() -> None:
    cp = FakeControlPlane()
    config = GatewayConfig(control_plane=CP, pools_from=PoolSource.KUBERNETES)
    gateway = Gateway(config, sink=InMemorySink(), registry=CollectorRegistry())
    link = ControlPlaneLink(gateway, transport=cp.transport)
    link.start()
    await asyncio.sleep(0.1)
    await asyncio.wait_for(link.stop(), 2)
    assert cp.calls == []


def test_the_cli_outside_a_pod_says_how_to_reach_an_api_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from goodput.cli import app

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    out = CliRunner().invoke(app, ["gateway", "--pools-from", "kubernetes"])
    assert out.exit_code == 2
    assert "KUBERNETES_SERVICE_HOST is not set" in out.output
    assert "--kubernetes-api" in out.output
