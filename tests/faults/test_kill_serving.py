"""Serving processes killed mid-request: a decode worker (the gateway fails that request
cleanly, an error event then ``[DONE]``, and routes the next ones to the instance left) and
the gateway itself (its clients get a broken stream; every record its exporter reported
delivered is in the control plane, and the rest is bounded by the requests it had taken).

Real processes on loopback: a control plane (SQLite), sim workers (``goodput worker
--engine sim``: the H100 timing model in real time, no vLLM) and the PD gateway, each in its
own process group, killed with SIGKILL as a crash would.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from goodput._demo_processes import ChildProcess, pick_port, run_cli
from serving.workers.load import metric_sum

pytestmark = pytest.mark.faults

HOST = "127.0.0.1"
MODEL = "llama-3.1-8b"
PROFILE = "h100-llama3.1-8b"
LONG_TOKENS = 1500  # about 10 s of decode steps on the H100 model: time to kill mid-stream


@dataclass
class Stack:
    directory: Path
    env: dict[str, str]
    keys: dict[str, str]
    cp_url: str = ""
    children: dict[str, ChildProcess] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], health: str) -> ChildProcess:
        child = ChildProcess(
            [sys.executable, "-m", "goodput", *argv], self.env, self.directory / f"{name}.log"
        )
        self.children[name] = child
        child.wait_http(health, name, timeout_s=90.0)
        return child

    def worker(self, name: str, role: str, seed: int) -> str:
        port = pick_port(HOST, 0)
        url = f"http://{HOST}:{port}"
        self.start(name, [
            "worker", "--engine", "sim", "--profile", PROFILE, "--role", role,
            "--host", HOST, "--port", str(port), "--kv-dir", str(self.directory / "kv"),
            "--sim-config", "jitter=0", "--seed", str(seed),
        ], f"{url}/health")  # fmt: skip
        return url

    def gateway(self, prefill: list[str], decode: list[str]) -> str:
        port = pick_port(HOST, 0)
        url = f"http://{HOST}:{port}"
        argv = ["gateway", "--host", HOST, "--port", str(port), "--log-level", "WARNING",
                "--gateway-id", "faults-gateway"]  # fmt: skip
        for u in prefill:
            argv += ["--prefill", u]
        for u in decode:
            argv += ["--decode", u]
        if self.cp_url:
            argv += ["--control-plane", self.cp_url, "--ingest-key", self.keys["ingest"]]
        self.start("gateway", argv, f"{url}/health")
        return url


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    env = {**os.environ, "GOODPUT_DATABASE_URL": f"sqlite:///{tmp_path / 'goodput.db'}",
           "GOODPUT_PLANNER_ENABLED": "false", "GOODPUT_ADMISSION_ENABLED": "false"}  # fmt: skip
    run_cli(env, "db", "upgrade")
    keys = {"ingest": run_cli(env, "admin", "create-key", "--role", "ingest", "--name", "i")}
    made = Stack(tmp_path, env, {k: v.strip() for k, v in keys.items()})
    try:
        yield made
    finally:
        for child in reversed(list(made.children.values())):
            child.stop(timeout_s=10.0)


def body(max_tokens: int, tag: str) -> dict[str, object]:
    # Distinct prompts: the gateway pins a shared prefix to one decode instance.
    return {"model": MODEL, "prompt": f"{tag} " + "hello " * 200, "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True}  # fmt: skip


@dataclass
class StreamResult:
    events: list[str] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None  # an error event from the gateway
    broken: str | None = None  # the connection itself broke
    first_token: threading.Event = field(default_factory=threading.Event)


def stream(url: str, max_tokens: int, result: StreamResult, tag: str = "") -> None:
    try:
        with (
            httpx.Client(timeout=60.0) as client,
            client.stream("POST", f"{url}/v1/completions", json=body(max_tokens, tag)) as response,
        ):
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                result.events.append(data)
                if data == "[DONE]":
                    continue
                event = json.loads(data)
                if "error" in event:
                    result.error = str(event["error"])
                elif event.get("choices"):
                    result.tokens += 1
                    result.first_token.set()
    except httpx.HTTPError as exc:
        result.broken = f"{type(exc).__name__}: {exc}"
    finally:
        result.first_token.set()


def test_a_decode_worker_killed_mid_stream_fails_that_request_cleanly(stack: Stack) -> None:
    prefill = stack.worker("prefill", "prefill", 0)
    decode = [stack.worker(f"decode{k}", "decode", k + 1) for k in range(2)]
    gateway = stack.gateway([prefill], decode)

    # Two long streams: the gateway routes by load, so one lands on each decode instance.
    # The second starts once the first streams (its decode instance is then chosen and
    # loaded; a fixed pause was too short on a busy machine, and both landed on one).
    results = [StreamResult(), StreamResult()]
    threads = [
        threading.Thread(target=stream, args=(gateway, LONG_TOKENS, r, f"s{k}"), daemon=True)
        for k, r in enumerate(results)
    ]
    for thread, r in zip(threads, results, strict=True):
        thread.start()
        assert r.first_token.wait(30), "no first token"
    time.sleep(0.5)
    stack.children["decode0"].kill()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()

    failed = [r for r in results if r.error is not None]
    finished = [r for r in results if r.error is None]
    assert len(failed) == 1 and len(finished) == 1, [(r.error, r.tokens) for r in results]
    # The broken one: an error event naming the decode stream, then [DONE]; no broken socket.
    assert failed[0].broken is None
    assert "decode" in (failed[0].error or "")
    assert failed[0].events[-1] == "[DONE]"
    assert 0 < failed[0].tokens < LONG_TOKENS
    # The other one never noticed.
    assert finished[0].broken is None and finished[0].tokens == LONG_TOKENS

    # The next requests go to the decode instance left; none of them fails.
    for k in range(6):
        r = StreamResult()
        stream(gateway, 8, r, f"n{k}")
        assert r.error is None and r.broken is None and r.tokens == 8, r.events[-3:]


def test_a_gateway_killed_mid_stream_leaves_its_exports_accounted_for(stack: Stack) -> None:
    cp_port = pick_port(HOST, 0)
    stack.cp_url = f"http://{HOST}:{cp_port}"
    stack.start("controlplane", ["controlplane", "serve", "--no-migrate", "--host", HOST,
                                 "--port", str(cp_port)], f"{stack.cp_url}/ready")  # fmt: skip
    prefill = stack.worker("prefill", "prefill", 0)
    decode = stack.worker("decode", "decode", 1)
    gateway = stack.gateway([prefill], [decode])

    short = 0
    for k in range(20):  # finished requests, whose records the exporter ships
        r = StreamResult()
        stream(gateway, 4, r, f"n{k}")
        assert r.tokens == 4
        short += 1
    long_results = [StreamResult() for _ in range(3)]
    threads = [
        threading.Thread(target=stream, args=(gateway, LONG_TOKENS, r, f"s{k}"), daemon=True)
        for k, r in enumerate(long_results)
    ]
    for thread in threads:
        thread.start()
    for r in long_results:
        assert r.first_token.wait(30)
    time.sleep(1.0)  # the exporter's flush interval passes: the short ones are delivered
    text = httpx.get(f"{gateway}/metrics", timeout=5).text
    delivered = metric_sum(text, "goodput_exporter_exported_records_total")
    stack.children["gateway"].kill()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()

    # The clients see a broken stream, not a hang and not a clean end.
    for r in long_results:
        assert r.broken is not None, r.events[-3:]
        assert r.events[-1:] != ["[DONE]"]
        assert 0 < r.tokens < LONG_TOKENS

    # What the exporter reported delivered is in the control plane; nothing more than the
    # gateway had finished can be (the streams in flight had no record yet).
    assert delivered >= 1
    cp_metrics = httpx.get(f"{stack.cp_url}/metrics", timeout=5).text
    ingested = metric_sum(cp_metrics, "goodput_ingest_records_total")
    assert delivered <= ingested <= short
