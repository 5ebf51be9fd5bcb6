"""A supervised vLLM worker: it serves, it comes back after a crash, its agent reports it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from exporters.commands import CommandKind
from exporters.fleet import FleetState, PoolRole

from .conftest import READY_TIMEOUT_S, ControlPlane, PDPair, complete, token_prompt

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def test_worker_answers_a_completion(pd_pair: PDPair) -> None:
    answer = complete(pd_pair.prefill.url, token_prompt(20, seed=1), max_tokens=5)

    assert answer["usage"]["completion_tokens"] == 5
    assert answer["usage"]["prompt_tokens"] == 20
    status = pd_pair.prefill.status()
    assert status.state is FleetState.READY
    assert status.pid is not None


def test_agents_register_and_report_load(pd_pair: PDPair, control_plane: ControlPlane) -> None:
    deadline = time.monotonic() + 15
    while True:
        members = {m["id"]: m for m in control_plane.fleet()}
        prefill = members.get(pd_pair.prefill.agent.settings.member_id)  # type: ignore[union-attr]
        decode = members.get(pd_pair.decode.agent.settings.member_id)  # type: ignore[union-attr]
        if prefill and decode and prefill["state"] == decode["state"] == "ready":
            break
        assert time.monotonic() < deadline, members
        time.sleep(0.5)

    assert (prefill["role"], decode["role"]) == ("prefill", "decode")
    assert prefill["kind"] == "worker"
    assert prefill["endpoint"] == pd_pair.prefill.url
    assert prefill["model"] == "tiny"
    assert not prefill["stale"]
    assert {"num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio"} <= set(
        prefill["load"]
    )


def test_killed_server_is_restarted(pd_pair: PDPair) -> None:
    worker = pd_pair.decode
    before = worker.status()
    assert before.pid is not None

    os.kill(before.pid, signal.SIGKILL)  # the API server dies; its engine core is orphaned
    deadline = time.monotonic() + 30
    while worker.status().num_crashes == before.num_crashes:
        assert time.monotonic() < deadline, "the supervisor never noticed the crash"
        time.sleep(0.1)
    assert worker.status().state in {FleetState.DOWN, FleetState.STARTING}
    worker.wait_ready(READY_TIMEOUT_S)

    after = worker.status()
    assert after.num_crashes == before.num_crashes + 1
    assert after.num_restarts == before.num_restarts + 1
    assert after.last_exit_code == -signal.SIGKILL
    assert after.pid is not None and after.pid != before.pid
    assert after.state is FleetState.READY
    answer = complete(worker.url, token_prompt(20, seed=2), max_tokens=3)
    assert answer["usage"]["completion_tokens"] == 3


def _member_state(control_plane: ControlPlane, member_id: str, **expected: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        member = next(m for m in control_plane.fleet() if m["id"] == member_id)
        if all(member[k] == v for k, v in expected.items()):
            return
        assert time.monotonic() < deadline, (member, expected)
        time.sleep(0.3)


def test_drain_and_role_changes_reach_the_fleet_registry(
    pd_pair: PDPair, control_plane: ControlPlane
) -> None:
    worker = pd_pair.prefill
    member_id = worker.agent.settings.member_id  # type: ignore[union-attr]
    pid = worker.status().pid
    try:
        assert worker.apply_command(CommandKind.DRAIN, {}).startswith("draining")
        _member_state(control_plane, member_id, state="drained")  # idle: nothing in flight
        worker.apply_command(CommandKind.SET_ROLE, {"role": PoolRole.DECODE})
        _member_state(control_plane, member_id, role="decode")
    finally:
        worker.apply_command(CommandKind.SET_ROLE, {"role": PoolRole.PREFILL})
        worker.apply_command(CommandKind.RESUME, {})
    _member_state(control_plane, member_id, state="ready", role="prefill")
    assert worker.status().pid == pid  # kv_both: no restart for any of it
