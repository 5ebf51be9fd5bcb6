"""The agent against the real control plane (create_app on SQLite, uvicorn on loopback)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from exporters.commands import CommandKind
from migrations import upgrade
from serving.workers import Agent, AgentReport, AgentSettings
from tests.e2e.vllm.conftest import ControlPlane, free_port, mint_keys

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    database_url = f"sqlite:///{tmp_path_factory.mktemp('agent') / 'goodput.db'}"
    upgrade(database_url)
    port = free_port()
    control = ControlPlane(
        url=f"http://127.0.0.1:{port}",
        port=port,
        database_url=database_url,
        keys=mint_keys(database_url),
    )
    control.start()
    yield control
    control.stop()


class Worker:
    state = "starting"
    role = "decode"

    def report(self) -> AgentReport:
        return AgentReport(role=self.role, state=self.state, load={"num_requests_waiting": 3})

    def apply(self, kind: CommandKind, payload: Mapping[str, Any]) -> str:
        raise AssertionError("the control plane sends no commands yet")


def member(plane: ControlPlane, member_id: str) -> dict[str, Any]:
    response = httpx.get(f"{plane.url}/api/v1/fleet/{member_id}", headers=plane.headers("viewer"))
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def test_registration_and_heartbeats_reach_the_fleet_registry(plane: ControlPlane) -> None:
    worker = Worker()
    settings = AgentSettings(
        url=plane.url,
        key=plane.keys["agent"],
        member_id="127.0.0.1:9100",
        endpoint="http://127.0.0.1:9100",
        model="tiny",
    )
    agent = Agent(settings, report=worker.report, apply=worker.apply)
    try:
        assert agent.step() == settings.heartbeat_interval_s
        registered = member(plane, "127.0.0.1:9100")
        worker.state = "ready"
        agent.step()
        beaten = member(plane, "127.0.0.1:9100")
    finally:
        agent.stop()

    assert registered["kind"] == "worker"
    assert (registered["role"], registered["state"]) == ("decode", "starting")
    assert registered["load"] == {"num_requests_waiting": 3}
    assert beaten["state"] == "ready"
    assert not beaten["stale"]
    stats = agent.stats()
    assert (stats.num_registrations, stats.num_heartbeats, stats.num_failures) == (1, 1, 0)
    assert stats.commands_supported is True  # the control plane offers the command routes


def test_a_control_plane_outage_is_survived(plane: ControlPlane, tmp_path: Path) -> None:
    worker = Worker()
    settings = AgentSettings(
        url=plane.url, key=plane.keys["agent"], member_id="w-outage", endpoint="http://w:1"
    )
    agent = Agent(settings, report=worker.report, apply=worker.apply)
    try:
        agent.step()
        plane.stop()
        delay = agent.step()
        plane.start()
        recovered = agent.step()
    finally:
        agent.stop()
        if not plane.running:
            plane.start()

    assert delay == settings.backoff_initial_s
    assert recovered == settings.heartbeat_interval_s
    assert agent.stats().num_failures == 1
    assert member(plane, "w-outage")["endpoint"] == "http://w:1"


def test_a_wrong_key_is_reported_not_raised(plane: ControlPlane) -> None:
    worker = Worker()
    settings = AgentSettings(
        url=plane.url, key=plane.keys["viewer"], member_id="w-x", endpoint="http://w:2"
    )
    agent = Agent(settings, report=worker.report, apply=worker.apply)
    try:
        delay = agent.step()
    finally:
        agent.stop()

    assert delay == settings.backoff_initial_s
    assert not agent.stats().registered
