"""The supervisor's state machine against a scripted server (no vLLM, short intervals)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from exporters.commands import CommandKind
from exporters.fleet import FleetState, PoolRole
from serving.workers import ServerError, SupervisorSettings, VllmSpec, WorkerSupervisor

FAST = SupervisorSettings(
    health_interval_s=0.01,
    ready_timeout_s=0.3,
    unhealthy_after=3,
    backoff_initial_s=0.02,
    backoff_max_s=0.05,
    kv_policy=None,
)


class ScriptedServer:
    """A server whose health each start is scripted: ``ready_after`` checks until healthy,
    then healthy for ``healthy_for`` checks (``None``: for ever), then hung or dead."""

    def __init__(self, ready_after: int = 1, healthy_for: int | None = None, dies: bool = False):
        self.ready_after, self.healthy_for, self.dies = ready_after, healthy_for, dies
        self.starts = 0
        self.kills = 0
        self.stops = 0
        self._checks = 0
        self._running = False
        self._returncode: int | None = None

    @property
    def pid(self) -> int | None:
        return 1000 + self.starts if self._running else None

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def start(self) -> None:
        self.starts += 1
        self._checks = 0
        self._running, self._returncode = True, None

    def alive(self) -> bool:
        return self._running

    def healthy(self, timeout_s: float = 2.0) -> bool:
        self._checks += 1
        if self._checks <= self.ready_after:
            return False
        if self.healthy_for is None or self._checks <= self.ready_after + self.healthy_for:
            return True
        if self.dies:
            self._running, self._returncode = False, -9
        return False

    def kill(self) -> None:
        self.kills += 1
        if self._running:
            self._running, self._returncode = False, -9

    def stop(self, timeout_s: float = 20.0) -> None:
        self.stops += 1
        self._running = False

    def log_tail(self, num_bytes: int = 4000) -> str:
        return "(scripted)"


def supervisor(server: ScriptedServer, settings: SupervisorSettings = FAST) -> WorkerSupervisor:
    spec = VllmSpec(model=Path("/models/tiny"), port=8100)
    return WorkerSupervisor(
        spec, run_dir=Path("/unused"), role=PoolRole.PREFILL, settings=settings, server=server
    )


def eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


def test_starts_and_becomes_ready() -> None:
    server = ScriptedServer(ready_after=2)
    worker = supervisor(server)
    worker.start()
    try:
        worker.wait_ready(5)
        status = worker.status()
    finally:
        worker.stop()

    assert (status.state, status.role, status.pid) == (FleetState.READY, PoolRole.PREFILL, 1001)
    assert (status.num_restarts, status.num_crashes) == (0, 0)
    assert server.stops >= 1 and not server.alive()
    assert worker.status().state is FleetState.DOWN


def test_a_dead_server_is_restarted_and_counted() -> None:
    server = ScriptedServer(ready_after=1, healthy_for=3, dies=True)
    worker = supervisor(server)
    worker.start()
    try:
        eventually(lambda: worker.status().num_restarts >= 2)
        status = worker.status()
    finally:
        worker.stop()

    assert status.num_crashes >= 2
    assert status.last_exit_code == -9
    assert server.starts >= 3


def test_a_hung_server_is_killed_after_failed_checks() -> None:
    server = ScriptedServer(ready_after=1, healthy_for=2, dies=False)
    worker = supervisor(server)
    worker.start()
    try:
        eventually(lambda: worker.status().num_crashes >= 1)
    finally:
        worker.stop()

    assert server.kills >= 1
    assert worker.status().last_exit_code == -9


def test_a_server_never_ready_is_restarted_after_the_ready_timeout() -> None:
    server = ScriptedServer(ready_after=10**9)
    worker = supervisor(server)
    worker.start()
    try:
        eventually(lambda: server.starts >= 2)
        with pytest.raises(ServerError) as caught:
            worker.wait_ready(0.05)
    finally:
        worker.stop()

    assert "not ready after 0.05 s" in str(caught.value)
    assert worker.status().num_crashes >= 1


def test_drain_resume_and_set_role() -> None:
    worker = supervisor(ScriptedServer())
    worker.start()
    try:
        worker.wait_ready(5)
        drained = worker.apply_command(CommandKind.DRAIN, {})
        state_drained = worker.status().state  # idle: nothing running or waiting
        resumed = worker.apply_command(CommandKind.RESUME, {})
        role = worker.apply_command(CommandKind.SET_ROLE, {"role": PoolRole.DECODE})
        report = worker.report()
    finally:
        worker.stop()

    assert drained == "draining (drained)"
    assert state_drained is FleetState.DRAINED
    assert resumed == "resumed (ready)"
    assert role == "role prefill -> decode (kv_both: no restart)"
    assert (report.role, report.state) == ("decode", "ready")
    assert report.load == {
        "num_requests_running": 0,
        "num_requests_waiting": 0,
        "kv_cache_usage_ratio": 0.0,
        "num_restarts": 0,
    }
    with pytest.raises(ValueError, match="'set_admission_policy' is not a worker command"):
        worker.apply_command(CommandKind.SET_ADMISSION_POLICY, {})
