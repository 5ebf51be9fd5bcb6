"""The PD planner live, as real processes on loopback (no vLLM): a control plane with its
planner ticking every second, one prefill and three decode sim workers (H100 Llama-3.1-8B
timing, real time, agents), the PD gateway shipping its records. A prefill-heavy stream of
requests overloads the single prefill worker; the planner moves a decode worker to the
prefill pool (drain → set_role → resume, every command acknowledged), the gateway routes to
it, and not one request fails.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from goodput._demo_processes import ChildProcess, pick_port, run_cli

pytestmark = pytest.mark.e2e

HOST = "127.0.0.1"
MODEL = "llama-3.1-8b"
PROFILE = "h100-llama3.1-8b"
# The planner acts fast here: a tick a second, each worker moves at most once in the test.
# Admission is off: the gateway refuses nothing, so every request must come back 200.
PLANNER_ENV = {
    "GOODPUT_ADMISSION_ENABLED": "false",
    "GOODPUT_PLANNER_INTERVAL_S": "1",
    "GOODPUT_PLANNER_MIN_DWELL_S": "600",
    "GOODPUT_PLANNER_OBSERVE_AFTER_S": "3",
    "GOODPUT_PLANNER_DRAIN_TIMEOUT_S": "5",
    "GOODPUT_PLANNER_WINDOW_S": "20",
}
PROMPT_WORDS = 3000  # the sim worker counts whitespace words as tokens
RATE_PER_S = 14.0  # 42k prompt tokens/s: more than one H100 prefill (about 32k/s)


class Stack:
    def __init__(
        self, cp_url: str, gateway_url: str, workers: dict[str, str], keys: dict[str, str]
    ):
        self.cp_url, self.gateway_url, self.workers, self.keys = cp_url, gateway_url, workers, keys

    def get(self, path: str, **params: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.keys['operator']}"}
        response = httpx.get(f"{self.cp_url}{path}", params=params, headers=headers, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()


def _wait(url: str, child: ChildProcess, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert child.alive(), f"{child.log_path} exited:\n{child.log_tail()}"
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"{url} not ready in {timeout_s:g} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory: Path = tmp_path_factory.mktemp("planner-live")
    env = {
        **os.environ,
        "GOODPUT_DATABASE_URL": f"sqlite:///{directory / 'goodput.db'}",
        **PLANNER_ENV,
    }
    run_cli(env, "db", "upgrade")
    keys = {
        role: run_cli(env, "admin", "create-key", "--role", role, "--name", f"e2e-{role}").strip()
        for role in ("ingest", "agent", "viewer", "operator", "admin")
    }
    children: list[ChildProcess] = []

    def start(name: str, argv: list[str]) -> ChildProcess:
        child = ChildProcess(
            [sys.executable, "-m", "goodput", *argv], env, directory / f"{name}.log"
        )
        children.append(child)
        return child

    try:
        cp_port = pick_port(HOST, 0)
        cp_url = f"http://{HOST}:{cp_port}"
        cp = start("controlplane", ["controlplane", "serve", "--no-migrate", "--host", HOST,
                                    "--port", str(cp_port)])  # fmt: skip
        waits = [(f"{cp_url}/ready", cp)]
        workers: dict[str, str] = {}
        for seed, name in enumerate(("p0", "d0", "d1", "d2")):
            port = pick_port(HOST, 0)
            workers[name] = f"http://{HOST}:{port}"
            role = "prefill" if name.startswith("p") else "decode"
            child = start(name, [
                "worker", "--engine", "sim", "--profile", PROFILE, "--role", role,
                "--host", HOST, "--port", str(port), "--kv-dir", str(directory / "kv"),
                "--seed", str(seed), "--control-plane", cp_url, "--agent-key", keys["agent"],
                "--heartbeat-interval-s", "1",
            ])  # fmt: skip
            waits.append((f"{workers[name]}/health", child))
        gw_port = pick_port(HOST, 0)
        gateway_url = f"http://{HOST}:{gw_port}"
        gateway = start("gateway", [
            "gateway", "--host", HOST, "--port", str(gw_port),
            "--prefill", workers["p0"],
            "--decode", workers["d0"], "--decode", workers["d1"], "--decode", workers["d2"],
            "--control-plane", cp_url, "--ingest-key", keys["ingest"],
            "--agent-key", keys["agent"], "--viewer-key", keys["viewer"],
            "--gateway-id", "e2e-planner-gateway", "--fleet-refresh", "1",
            "--log-level", "WARNING",
        ])  # fmt: skip
        waits.append((f"{gateway_url}/health", gateway))
        for url, child in waits:
            _wait(url, child)
        slo = {
            "name": "e2e-planner",
            "selector": {"model": MODEL},
            "objectives": [
                {"metric": "ttft", "threshold_s": 0.5},
                {"metric": "itl", "threshold_s": 0.05},
            ],
            "target": 0.9,
            "window_s": 3600,
        }
        response = httpx.post(
            f"{cp_url}/api/v1/slos",
            json=slo,
            headers={"Authorization": f"Bearer {keys['operator']}"},
            timeout=10,
        )
        assert response.status_code == 201, response.text
        yield Stack(cp_url, gateway_url, workers, keys)
    finally:
        for child in reversed(children):
            child.stop(timeout_s=15.0)


async def _load(gateway_url: str, stop: asyncio.Event) -> list[int | str]:
    """Requests at ``RATE_PER_S`` until ``stop``; each one's status (or error)."""
    prompt = " ".join(f"w{k % 97}" for k in range(PROMPT_WORDS))
    results: list[int | str] = []

    async def one(client: httpx.AsyncClient) -> None:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
        try:
            response = await client.post(f"{gateway_url}/v1/completions", json=body)
            results.append(response.status_code)
        except httpx.HTTPError as exc:
            results.append(f"{type(exc).__name__}: {exc}")

    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
        tasks: list[asyncio.Task[None]] = []
        start = time.monotonic()
        k = 0
        while not stop.is_set():
            due = start + k / RATE_PER_S
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            tasks.append(asyncio.create_task(one(client)))
            k += 1
        await asyncio.gather(*tasks)
    return results


async def test_forced_imbalance_is_rebalanced_without_a_failed_request(stack: Stack) -> None:
    stop = asyncio.Event()
    load = asyncio.create_task(_load(stack.gateway_url, stop))
    move: dict[str, Any] | None = None
    try:
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            moves = (await asyncio.to_thread(stack.get, "/api/v1/automation/moves"))["data"]
            done = [m for m in moves if m["state"] == "done"]
            if done:
                move = done[-1]  # the first one done
                break
            assert not [m for m in moves if m["state"] == "failed"], moves
        if move is None:
            status = await asyncio.to_thread(stack.get, "/api/v1/automation")
            pytest.fail(f"no role move was done within 120 s; moves {moves}; planner {status}")
        await asyncio.sleep(5.0)  # requests now also go to the new prefill worker
    finally:
        stop.set()
        results = await load
    assert (move["from_role"], move["to_role"], move["source"]) == ("decode", "prefill", "planner")
    assert (
        move["predicted_effect"]["after"]["goodput_rps"]
        >= move["predicted_effect"]["before"]["goodput_rps"]
    )
    assert move["evidence"]["demand"]["prompt_tokens_per_s"] > 0
    for command_id in move["command_ids"]:
        command = stack.get(f"/api/v1/commands/{command_id}")
        assert command["state"] == "acked" and command["ack"]["ok"] is True, command
    member = stack.get(f"/api/v1/fleet/{move['member_id']}")
    assert (member["role"], member["state"]) == ("prefill", "ready")
    failed = [r for r in results if r != 200]
    assert len(results) > 100 and not failed, (len(results), failed[:5])
