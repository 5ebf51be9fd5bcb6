"""Live checks of the control loops (issue 6) on sim workers, as real processes on loopback.

:func:`control_stack` migrates a SQLite database, mints keys, starts the control plane
(``goodput controlplane serve``, its loops configured by ``GOODPUT_*`` variables), sim
workers (``goodput worker --engine sim``, H100 Llama-3.1-8B, one shared KV folder, each
registered through its agent) and gateways shipping their records to the control plane —
each in its own process group, stopped (SIGTERM, then SIGKILL) at the end. Sim workers, not
vLLM: the 2-core machine cannot overload a real model fast enough to matter, and a sim
worker queues, batches and drains as an H100 would (docs/sim-worker.md).

:func:`open_loop` is the client: Poisson arrivals at a fixed rate whatever the stack
answers (an open loop, so overload builds a queue), streaming completions with token-id
prompts (counted exactly by the gateway and the worker), each request's outcome kept.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from goodput._demo_processes import ChildProcess, pick_port, run_cli
from tests.e2e.stack_client import StackClient

HOST = "127.0.0.1"
MODEL = "llama-3.1-8b"
PROFILE = "h100-llama3.1-8b"


@dataclass(frozen=True)
class GatewaySpec:
    """One gateway: ``agent`` registers it and lets it receive commands (admission
    policies); without it the gateway never gets a policy (no control)."""

    gateway_id: str
    agent: bool = True


@dataclass
class ControlStack(StackClient):
    directory: Path
    cp_url: str
    gateways: dict[str, str]
    workers: dict[str, str]  # member id (host:port) -> URL
    keys: dict[str, str]
    children: list[ChildProcess] = field(default_factory=list)

    def eventually(
        self, check: Callable[[], Any], what: str, timeout_s: float = 30.0, every_s: float = 0.25
    ) -> Any:
        """``check()`` once it is truthy; fails naming ``what`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = check()
            if result:
                return result
            self.check_alive()
            assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
            time.sleep(every_s)


@contextmanager
def control_stack(
    directory: Path,
    *,
    settings: Mapping[str, str],
    roles: tuple[str, ...],
    gateways: tuple[GatewaySpec, ...],
    sim_config: str,
    fleet_refresh_s: float = 1.0,
) -> Iterator[ControlStack]:
    """The stack above: ``settings`` are the control plane's ``GOODPUT_*`` variables,
    ``roles`` one sim worker each (all named statically to every gateway by role)."""
    env = {**os.environ, "GOODPUT_DATABASE_URL": f"sqlite:///{directory / 'goodput.db'}"}
    run_cli(env, "db", "upgrade")
    keys = {
        role: run_cli(env, "admin", "create-key", "--role", role, "--name", f"e2e-{role}").strip()
        for role in ("ingest", "agent", "viewer", "operator", "admin")
    }
    python = [sys.executable, "-m", "goodput"]
    children: list[ChildProcess] = []

    def start(name: str, argv: list[str], child_env: Mapping[str, str]) -> ChildProcess:
        child = ChildProcess([*python, *argv], child_env, directory / f"{name}.log")
        children.append(child)
        return child

    try:
        cp_port = pick_port(HOST, 0)
        cp_url = f"http://{HOST}:{cp_port}"
        cp = start("controlplane", ["controlplane", "serve", "--no-migrate", "--host", HOST,
                                    "--port", str(cp_port)], {**env, **settings})  # fmt: skip
        waits = [(f"{cp_url}/ready", cp)]
        workers: dict[str, str] = {}
        by_role: dict[str, list[str]] = {"prefill": [], "decode": []}
        for seed, role in enumerate(roles):
            port = pick_port(HOST, 0)
            url = f"http://{HOST}:{port}"
            workers[f"{HOST}:{port}"] = url
            by_role[role].append(url)
            child = start(f"worker-{seed}-{role}", [
                "worker", "--engine", "sim", "--profile", PROFILE, "--role", role,
                "--host", HOST, "--port", str(port), "--kv-dir", str(directory / "kv"),
                "--sim-config", sim_config, "--seed", str(seed), "--control-plane", cp_url,
                "--agent-key", keys["agent"], "--ingest-key", keys["ingest"],
                "--heartbeat-interval-s", "1",
            ], env)  # fmt: skip
            waits.append((f"{url}/health", child))
        gateway_urls: dict[str, str] = {}
        for spec in gateways:
            port = pick_port(HOST, 0)
            gateway_urls[spec.gateway_id] = f"http://{HOST}:{port}"
            statics = [a for r in ("prefill", "decode") for u in by_role[r] for a in (f"--{r}", u)]
            agent = ["--agent-key", keys["agent"], "--command-poll", "0.5"] if spec.agent else []
            child = start(spec.gateway_id, [
                "gateway", "--host", HOST, "--port", str(port), *statics,
                "--control-plane", cp_url, "--ingest-key", keys["ingest"], *agent,
                "--viewer-key", keys["viewer"], "--gateway-id", spec.gateway_id,
                "--fleet-refresh", str(fleet_refresh_s), "--log-level", "WARNING",
            ], env)  # fmt: skip
            waits.append((f"{gateway_urls[spec.gateway_id]}/health", child))
        for url, child in waits:
            child.wait_http(url, url, timeout_s=90.0)
        yield ControlStack(directory, cp_url, gateway_urls, workers, keys, children)
    finally:
        for child in reversed(children):
            child.stop(timeout_s=15.0)


@dataclass(frozen=True)
class Outcome:
    """One request as the client saw it."""

    index: int
    priority: str
    status: int  # HTTP status; 0: the connection failed
    sent_s: float  # since the run's start
    end_s: float  # when its answer ended, since the run's start
    ttft_s: float | None  # first content chunk, for 200s
    chunks: int  # content chunks received (a late worker may write several tokens at once)
    complete: bool  # a 200 whose stream ended with a finish reason and [DONE]
    headers: dict[str, str]
    body: Any  # the JSON error body of a non-200, else None


async def _one(
    client: httpx.AsyncClient,
    url: str,
    index: int,
    priority: str,
    headers: dict[str, str],
    prompt_tokens: int,
    max_tokens: int,
    t0: float,
) -> Outcome:
    # A distinct first token per request: prompts share no prefix block (no cache hits)
    # and the KV hand-off keys are unique.
    body = {
        "model": MODEL,
        "prompt": [index + 1] + [7] * (prompt_tokens - 1),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    sent = time.monotonic()
    ttft: float | None = None
    tokens, done, finished = 0, False, False
    try:
        async with client.stream(
            "POST", f"{url}/v1/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                try:
                    error = json.loads(text)
                except ValueError:
                    error = text
                return Outcome(index, priority, response.status_code, sent - t0,
                               time.monotonic() - t0, None, 0, False, dict(response.headers),
                               error)  # fmt: skip
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    continue
                choice = json.loads(data)["choices"][0]
                if choice.get("text"):
                    tokens += 1
                    if ttft is None:
                        ttft = time.monotonic() - sent
                if choice.get("finish_reason"):
                    finished = True
            return Outcome(index, priority, 200, sent - t0, time.monotonic() - t0, ttft, tokens,
                           done and finished, {}, None)  # fmt: skip
    except httpx.HTTPError as error:
        end = time.monotonic() - t0
        return Outcome(index, priority, 0, sent - t0, end, ttft, tokens, False, {}, repr(error))


def open_loop(
    url: str,
    *,
    rate_rps: float,
    duration_s: float,
    prompt_tokens: Callable[[np.random.Generator], int],
    max_tokens: int,
    headers_of: Callable[[int], tuple[str, dict[str, str]]],
    seed: int,
    first_index: int = 0,
) -> list[Outcome]:
    """Send Poisson arrivals at ``rate_rps`` for ``duration_s`` seconds to ``url`` (never
    waiting for answers) and return every request's outcome, in sending order.
    ``headers_of(k)`` gives request k's priority label and headers."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate_rps, size=int(rate_rps * duration_s * 2) + 10)
    send_at = np.cumsum(gaps)
    send_at = send_at[send_at < duration_s]
    lengths = [prompt_tokens(rng) for _ in send_at]

    async def run() -> list[Outcome]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        timeout = httpx.Timeout(180.0, connect=10.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            t0 = time.monotonic()
            tasks = []
            for k, (at, length) in enumerate(zip(send_at, lengths, strict=True)):
                delay = t0 + float(at) - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                index = first_index + k
                priority, headers = headers_of(index)
                tasks.append(asyncio.create_task(
                    _one(client, url, index, priority, headers, length, max_tokens, t0)
                ))  # fmt: skip
            return list(await asyncio.gather(*tasks))

    return asyncio.run(run())
