"""``kill -9`` of the leading control plane while the planner is moving a worker: the other
replica leads within 10 s with a higher fencing epoch, finishes the move from where it
stands — one drain, one set_role, one resume, the move done once, the worker in its new
role — and no record acknowledged before the kill is lost or counted twice.

The stack, real processes on loopback, two replicas (cp-a, cp-b) on one PostgreSQL schema:

- cp-a starts first and leads; its planner ticks every second. The gateway ships its
  records to cp-a, so cp-a's planner sees the demand (a leader's loops see only their
  replica's ingest: docs/scale-out.md, "Not yet").
- Three sim workers (one prefill, two decode) whose agents register with cp-b, the replica
  that survives. An agent takes one control-plane URL; in a deployment it is the load
  balancer's address, and steering agents and exporters away from a dead replica is the load
  balancer's job, not the control plane's — here the agents simply talk to the survivor.
  The workers ship no records (cp-b's planner then sees no demand and starts no move of its
  own: whatever it does to the fleet is finishing cp-a's move).
- The imbalance, as in ``tests/e2e/control/test_live_rebalance.py``: long prompts and short
  outputs at 90 % of the lone prefill worker's capacity, built up with automation paused.

Once the planner has issued the move's drain (the move ``draining`` or ``switching``, not
``done``), cp-a gets ``kill -9``. Its records: the gateway's exporter keeps what cp-a did not
acknowledge and retries it; what cp-a acknowledged is in cp-a's write-ahead log only. A
real deployment restarts the killed pod on its own volume (a StatefulSet), and the load
balancer sends the exporter's retries to a live replica meanwhile; here the gateway is tied
to cp-a, so cp-a is restarted after the failover: it replays its log, follows (cp-b keeps
the lease), and takes the exporter's retries. cp-a then counts each request exactly once.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from goodput._demo_processes import ChildProcess, pick_port
from serving.sim.latency_model import LatencyModel
from serving.workers.load import metric_sum
from tests.e2e.control.conftest import MODEL, PROFILE, open_loop
from tests.faults.conftest import ControlPlane
from tests.faults.test_leader_failover import leading, wait_for_leader
from tests.integration.controlplane.conftest import create_schema, drop_schema, schema_url

pytestmark = pytest.mark.faults

HOST = "127.0.0.1"
FAILOVER_S = 10.0
PROMPT_MIN, PROMPT_MAX, OUTPUT = 6000, 10000, 4
LOAD = 0.9  # offered load ÷ one prefill worker's capacity at the mean prompt
DURATION_S = 40.0  # seconds of arrivals: the move, the kill and the failover happen inside
PAUSED_S = 8.0  # automation paused while the imbalance builds
SETTINGS = {
    "durable_ingest": "true",
    "wal_fsync": "false",  # kill -9 of a process, not of the machine: the page cache holds
    "admission_enabled": "false",
    "planner_enabled": "true",
    "planner_interval_s": "1",
    "planner_min_dwell_s": "5",
    "planner_observe_after_s": "5",
    "planner_drain_timeout_s": "30",
}


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[ControlPlane, ControlPlane]]:
    schema = create_schema()
    first = ControlPlane(tmp_path / "a")
    second = ControlPlane(tmp_path / "b")
    try:
        first.folder.mkdir()
        second.folder.mkdir()
        first.prepare(
            replica_id="cp-a", database_url=schema_url(schema),
            wal_dir=str(first.folder / "wal"), **SETTINGS,
        )  # fmt: skip
        for role in ("agent", "viewer"):
            first.keys[role] = first.cli("admin", "create-key", "--role", role, "--name", role)
        second.env = {
            **first.env, "GOODPUT_REPLICA_ID": "cp-b", "GOODPUT_WAL_DIR": str(second.folder / "wal")
        }  # fmt: skip
        second.keys = first.keys
        yield first, second
    finally:
        first.stop()
        second.stop()
        drop_schema(schema)


def _prefill_rate_rps() -> float:
    return 1.0 / LatencyModel.for_profile(PROFILE).prefill_s([(PROMPT_MIN + PROMPT_MAX) // 2])


def _get(plane: ControlPlane, path: str, **params: Any) -> Any:
    with plane.admin() as http:
        response = http.get(path, params=params)
        response.raise_for_status()
        return response.json()


def _post(plane: ControlPlane, path: str, body: dict[str, Any]) -> Any:
    with plane.admin() as http:
        response = http.post(path, json=body)
        assert response.status_code in (200, 201), response.text
        return response.json()


def _eventually(check: Any, what: str, timeout_s: float, every_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(every_s)


def _stack(
    first: ControlPlane, second: ControlPlane, folder: Path
) -> tuple[dict[str, str], str, list[ChildProcess]]:
    """Sim workers (agents on ``second``) and a gateway (records to ``first``)."""
    python = [sys.executable, "-m", "goodput"]
    children: list[ChildProcess] = []
    workers: dict[str, str] = {}
    statics: list[str] = []
    waits = []
    for seed, role in enumerate(("prefill", "decode", "decode")):
        port = pick_port(HOST, 0)
        url = f"http://{HOST}:{port}"
        workers[f"{HOST}:{port}"] = url
        statics += [f"--{role}", url]
        child = ChildProcess([*python,
            "worker", "--engine", "sim", "--profile", PROFILE, "--role", role,
            "--host", HOST, "--port", str(port), "--kv-dir", str(folder / "kv"),
            "--sim-config", "jitter=0.02", "--seed", str(seed), "--control-plane", second.url,
            "--agent-key", first.keys["agent"], "--heartbeat-interval-s", "1",
        ], first.env, folder / f"worker-{seed}-{role}.log")  # fmt: skip
        children.append(child)
        waits.append((f"{url}/health", child))
    port = pick_port(HOST, 0)
    gateway = f"http://{HOST}:{port}"
    child = ChildProcess([*python,
        "gateway", "--host", HOST, "--port", str(port), *statics,
        "--control-plane", first.url, "--ingest-key", first.keys["ingest"],
        "--viewer-key", first.keys["viewer"], "--gateway-id", "gw-failover",
        "--fleet-refresh", "1", "--log-level", "WARNING",
    ], first.env, folder / "gateway.log")  # fmt: skip
    children.append(child)
    waits.append((f"{gateway}/health", child))
    for url, waiting in waits:
        waiting.wait_http(url, url, timeout_s=90.0)
    return workers, gateway, children


def test_kill_9_of_the_leader_during_a_planner_move(
    replicas: tuple[ControlPlane, ControlPlane], tmp_path: Path
) -> None:
    first, second = replicas
    first.start()
    _eventually(lambda: leading(first)[0], "cp-a leads", 10.0, 0.1)
    second.start()
    epoch = leading(first)[1]
    assert leading(second) == (False, 0)
    _post(first, "/api/v1/slos", {
        "name": "live-pd", "selector": {"model": MODEL}, "vantage": "gateway",
        "objectives": [{"metric": "ttft", "threshold_s": 0.5},
                       {"metric": "itl", "threshold_s": 0.05}],
        "target": 0.9, "window_s": 3600,
    })  # fmt: skip
    workers, gateway, children = _stack(first, second, tmp_path)
    try:
        fleet = _eventually(
            lambda: (
                len(m := {x["id"]: x["role"] for x in _get(second, "/api/v1/fleet", kind="worker")
                          ["data"] if x["state"] == "ready"}) == len(workers) and m
            ),
            "every worker registered", 60.0,
        )  # fmt: skip
        _post(first, "/api/v1/automation/pause", {"reason": "faults: let the imbalance build"})
        with ThreadPoolExecutor(1) as pool:
            traffic = pool.submit(
                open_loop, gateway, rate_rps=LOAD * _prefill_rate_rps(), duration_s=DURATION_S,
                max_tokens=OUTPUT, seed=5, headers_of=lambda k: ("standard", {}),
                prompt_tokens=lambda rng: int(rng.integers(PROMPT_MIN, PROMPT_MAX + 1)),
            )  # fmt: skip
            time.sleep(PAUSED_S)
            assert not _get(second, "/api/v1/automation/moves")["data"]
            _post(first, "/api/v1/automation/resume", {"reason": "faults: rebalance"})

            # Kill cp-a once its planner has issued the drain and before the move is done.
            def started() -> dict[str, Any] | None:
                moves = _get(second, "/api/v1/automation/moves")["data"]
                return moves[0] if moves else None

            at_kill = _eventually(started, "the planner starts a move", 30.0, 0.05)
            assert at_kill["state"] in ("draining", "switching"), at_kill
            commands_at_kill = [
                (c["kind"], c["state"]) for c in _get(second, "/api/v1/commands",
                                                      target=at_kill["member_id"])["data"]
            ]  # fmt: skip
            acknowledged_before = metric_sum(
                httpx.get(f"{gateway}/metrics", timeout=5).text,
                "goodput_exporter_exported_records_total",
            )
            first.kill()
            killed_at = time.monotonic()
            took_s = wait_for_leader(second, FAILOVER_S)
            assert leading(second)[1] == epoch + 1

            # cp-b finishes the move cp-a started.
            move = _eventually(
                lambda: (m := _get(second, f"/api/v1/automation/moves/{at_kill['id']}"))[
                    "state"] in ("done", "failed") and m,
                "the move finishes", 60.0,
            )  # fmt: skip
            done_after_s = time.monotonic() - killed_at
            # The killed replica comes back on its log and follows.
            first.start()
            assert leading(first) == (False, 0) and leading(second) == (True, epoch + 1)
            outcomes = traffic.result(timeout=DURATION_S + 180)
        for child in children:
            assert child.alive(), child.log_tail()

        # The move: done once, the worker in its new role.
        member = move["member_id"]
        assert (move["state"], move["from_role"], move["to_role"], move["source"]) == (
            "done", "decode", "prefill", "planner"), move  # fmt: skip
        moves = _get(second, "/api/v1/automation/moves")["data"]
        assert [m["id"] for m in moves] == [move["id"]], moves
        assert _get(second, f"/api/v1/fleet/{member}")["role"] == "prefill"
        assert httpx.get(f"{workers[member]}/sim", timeout=10).json()["role"] == "prefill"
        assert fleet[member] == "decode"
        # No command twice: one drain, one set_role, one resume, each acknowledged once.
        commands = _get(second, "/api/v1/commands", target=member)["data"]
        kinds = sorted(c["kind"] for c in commands)
        assert kinds == ["drain", "resume", "set_role"], commands
        assert all(c["state"] == "acked" for c in commands), commands
        assert sorted(map(str, move["command_ids"])) == sorted(c["id"] for c in commands)
        other = [c for w in workers if w != member
                 for c in _get(second, "/api/v1/commands", target=w)["data"]]  # fmt: skip
        assert not other, other
        audit = sorted(
            e["action"]
            for target in [move["id"], *(c["id"] for c in commands)]
            for e in _get(second, "/api/v1/audit", target_id=str(uuid.UUID(target)))["data"]
        )
        assert audit == sorted(["move.start", *["command.issue"] * 3, *["command.ack"] * 3]), audit

        # Records: cp-a counts every request the gateway recorded, once.
        failed = [(o.status, o.body) for o in outcomes if o.status != 200]
        assert not failed, failed[:5]

        def counted() -> int:
            stats = _get(first, "/api/v1/slos/live-pd/goodput", window="1h")
            return int(stats["requests"])

        _eventually(lambda: counted() >= len(outcomes), "every record counted", 60.0, 0.5)
        time.sleep(2.0)  # nothing more arrives: a duplicate would show now
        text = httpx.get(f"{gateway}/metrics", timeout=5).text
        exported = metric_sum(text, "goodput_exporter_exported_records_total")
        dropped = metric_sum(text, "goodput_exporter_dropped_records_total")
        assert counted() == len(outcomes) == exported, (counted(), len(outcomes), exported)
        assert 0 < acknowledged_before < exported and dropped == 0
        print(
            f"move {member} decode->prefill {at_kill['state']} at the kill (commands "
            f"{commands_at_kill}); cp-b led {took_s:.2f} s after kill -9 (epoch {epoch:.0f} -> "
            f"{epoch + 1:.0f}); the move done {done_after_s:.2f} s after the kill; {len(outcomes)} "
            f"requests, {acknowledged_before:.0f} records acknowledged before the kill, "
            f"{counted()} counted by cp-a after its restart; audit {audit}; load average "
            f"{os.getloadavg()[0]:.2f}"
        )
    finally:
        for child in reversed(children):
            child.stop(timeout_s=15.0)
