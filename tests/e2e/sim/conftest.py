"""The PD stack on sim workers, as real processes on loopback (no vLLM).

``running_stack(directory)`` (and the module fixture ``sim_stack``) migrates a SQLite
database, mints keys, starts the control plane (``goodput controlplane serve``), a prefill
and a decode sim worker (``goodput worker --engine sim``, sharing a KV folder, registered
through the agent, shipping engine records) and the PD gateway shipping its records to
the control plane — each in its own process group, stopped (SIGTERM, then SIGKILL) at
the end. ``start_pd`` starts the workers and the gateway alone, for a stack whose control
plane is started elsewhere (``tests/e2e/alerting``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from goodput._demo_processes import ChildProcess, pick_port, run_cli
from tests.e2e.stack_client import StackClient

HOST = "127.0.0.1"
MODEL = "llama-3.1-8b"
PROFILE = "h100-llama3.1-8b"
# The instances both sides run: no step-time jitter (the comparison isolates what real
# time adds), and a decode batch of at most 12 sequences, so that azure_conv at 1x queues
# on the decode worker now and then (docs/sim-worker.md).
SIM_CONFIG = "jitter=0,max_seqs=12"


@dataclass
class SimStack(StackClient):
    directory: Path
    cp_url: str
    gateway_url: str
    workers: dict[str, str]
    keys: dict[str, str]
    children: list[ChildProcess] = field(default_factory=list)


def start_pd(
    start: Callable[[str, list[str]], ChildProcess],
    *,
    cp_url: str,
    keys: Mapping[str, str],
    kv_dir: Path,
    gateway_id: str,
) -> tuple[dict[str, str], str, list[tuple[str, ChildProcess]]]:
    """A prefill and a decode sim worker and the PD gateway in front of them, attached to
    the control plane at ``cp_url`` (``keys``: ``agent``, ``ingest``, ``viewer``), each
    started by ``start(name, argv)``. Returns the workers' URLs by role, the gateway's URL,
    and the ``(health URL, process)`` pairs to wait on."""
    workers: dict[str, str] = {}
    waits: list[tuple[str, ChildProcess]] = []
    for seed, role in enumerate(("prefill", "decode")):
        port = pick_port(HOST, 0)
        workers[role] = f"http://{HOST}:{port}"
        child = start(role, [
            "worker", "--engine", "sim", "--profile", PROFILE, "--role", role,
            "--host", HOST, "--port", str(port), "--kv-dir", str(kv_dir),
            "--sim-config", SIM_CONFIG, "--seed", str(seed), "--control-plane", cp_url,
            "--agent-key", keys["agent"], "--ingest-key", keys["ingest"],
            "--heartbeat-interval-s", "1",
        ])  # fmt: skip
        waits.append((f"{workers[role]}/health", child))
    gw_port = pick_port(HOST, 0)
    gateway_url = f"http://{HOST}:{gw_port}"
    gateway = start("gateway", [
        "gateway", "--host", HOST, "--port", str(gw_port),
        "--prefill", workers["prefill"], "--decode", workers["decode"],
        "--control-plane", cp_url, "--ingest-key", keys["ingest"],
        "--agent-key", keys["agent"], "--viewer-key", keys["viewer"],
        "--gateway-id", gateway_id, "--log-level", "WARNING",
    ])  # fmt: skip
    waits.append((f"{gateway_url}/health", gateway))
    return workers, gateway_url, waits


@contextlib.contextmanager
def running_stack(directory: Path) -> Iterator[SimStack]:
    """A fresh stack (database, keys, processes) under ``directory``, stopped on exit."""
    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOODPUT_DATABASE_URL": f"sqlite:///{directory / 'goodput.db'}"}
    run_cli(env, "db", "upgrade")
    keys = {
        role: run_cli(env, "admin", "create-key", "--role", role, "--name", f"e2e-{role}").strip()
        for role in ("ingest", "agent", "viewer", "operator")
    }
    python = [sys.executable, "-m", "goodput"]
    children: list[ChildProcess] = []

    def start(name: str, argv: list[str]) -> ChildProcess:
        child = ChildProcess([*python, *argv], env, directory / f"{name}.log")
        children.append(child)
        return child

    try:
        cp_port = pick_port(HOST, 0)
        cp_url = f"http://{HOST}:{cp_port}"
        cp = start("controlplane", ["controlplane", "serve", "--no-migrate", "--host", HOST,
                                    "--port", str(cp_port)])  # fmt: skip
        waits = [(f"{cp_url}/ready", cp)]
        workers, gateway_url, fleet = start_pd(
            start, cp_url=cp_url, keys=keys, kv_dir=directory / "kv", gateway_id="e2e-sim-gateway"
        )
        waits += fleet
        for url, child in waits:
            child.wait_http(url, url, timeout_s=90.0)
        yield SimStack(directory, cp_url, gateway_url, workers, keys, children)
    finally:
        for child in reversed(children):
            child.stop(timeout_s=15.0)


@pytest.fixture(scope="module")
def sim_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimStack]:
    with running_stack(tmp_path_factory.mktemp("sim-stack")) as stack:
        yield stack
