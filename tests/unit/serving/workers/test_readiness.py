"""``/ready`` over real HTTP on loopback: 200 only while the worker is ready, so a drained
pod leaves the gateways' pools on Kubernetes (not-Ready pods are no members) and comes back
on resume; the engine is not touched (requests in flight finish)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest

from exporters.commands import CommandKind
from exporters.fleet import FleetState
from serving.workers import ReadinessServer, WorkerSupervisor
from tests.unit.serving.workers.test_supervisor import (
    FAST,
    ScriptedServer,
    eventually,
    supervisor,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def served() -> Iterator[tuple[WorkerSupervisor, ScriptedServer, ReadinessServer]]:
    server = ScriptedServer(ready_after=30)  # a restart takes >= 0.3 s: 503 is seen
    worker = supervisor(server, replace(FAST, ready_timeout_s=10.0))
    ready = ReadinessServer(lambda: worker.status().state, host="127.0.0.1", port=0)
    ready.start()
    try:
        yield worker, server, ready
    finally:
        worker.stop()
        ready.stop()


def probe(ready: ReadinessServer, path: str = "/ready") -> tuple[int, str]:
    response = httpx.get(f"{ready.url}{path}", timeout=2.0)
    return response.status_code, response.text


def test_ready_follows_start_drain_and_resume(
    served: tuple[WorkerSupervisor, ScriptedServer, ReadinessServer],
) -> None:
    worker, server, ready = served

    assert probe(ready) == (503, "starting\n")  # the engine is not started yet
    worker.start()
    worker.wait_ready(5)
    assert probe(ready) == (200, "ready\n")

    worker.apply_command(CommandKind.DRAIN, {})
    assert probe(ready) == (503, "drained\n")  # idle: nothing running or waiting
    assert probe(ready, "/health") == (200, "ok\n")  # the agent itself is alive
    worker.apply_command(CommandKind.RESUME, {})
    assert probe(ready) == (200, "ready\n")
    assert (server.starts, server.kills) == (1, 0)  # drain never touches the engine


def test_a_crashed_engine_is_not_ready(
    served: tuple[WorkerSupervisor, ScriptedServer, ReadinessServer],
) -> None:
    worker, _, ready = served
    worker.start()
    worker.wait_ready(5)

    worker.kill_engine()

    assert probe(ready)[0] == 503
    eventually(lambda: probe(ready) == (200, "ready\n"))  # restarted


def test_a_failing_state_source_is_not_ready() -> None:
    def broken() -> FleetState:
        raise RuntimeError("no state")

    ready = ReadinessServer(broken, host="127.0.0.1", port=0)
    ready.start()
    try:
        assert probe(ready) == (503, "unknown\n")
        assert probe(ready, "/other")[0] == 404
    finally:
        ready.stop()
