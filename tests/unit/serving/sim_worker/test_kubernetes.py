"""The sim worker on Kubernetes, as the vLLM worker (docs/deploy.md, "Roles are labels"):
``--kubernetes-relabel`` makes ``set_role`` patch the pod's ``goodput.dev/role`` label on
the API server (here the fake one on loopback) and acknowledges it done only then;
``--ready-port`` serves ``/ready``, 503 while starting, draining, drained or down and 200
while ready. The command itself runs as a process (``python -m goodput worker --engine
sim``) against a scripted control plane served over HTTP; readiness through a drain with a
request in flight runs in-process."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from exporters.commands import Command, CommandKind
from exporters.fleet import PoolRole
from goodput.cli import app
from serving.sim.worker.cli import SimWorkerSpec, build_worker
from serving.sim.worker.server import create_app
from serving.workers import ReadinessServer
from tests.unit.serving.gateway.fake_kubernetes import FakeKubernetes, pod, wait_for
from tests.unit.serving.workers.test_agent import MEMBER, FakeControlPlane

REPO = Path(__file__).resolve().parents[4]
runner = CliRunner()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def probe(url: str) -> tuple[int, str]:
    try:
        response = httpx.get(f"{url}/ready", timeout=2.0)
    except httpx.TransportError:
        return 0, "unreachable"
    return response.status_code, response.text


@contextmanager
def serving_plane(plane: FakeControlPlane) -> Iterator[str]:
    """``plane`` (an httpx.MockTransport handler) served over HTTP on loopback; its URL.
    One request at a time, so the test may change ``plane.commands`` between them."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            self._forward()

        def do_POST(self) -> None:
            self._forward()

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = httpx.Request(self.command, f"http://cp{self.path}",
                                    headers=dict(self.headers.items()),
                                    content=self.rfile.read(length))  # fmt: skip
            response = plane(request)
            self.send_response(response.status_code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(response.content)))
            self.end_headers()
            self.wfile.write(response.content)

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def command(kind: CommandKind, version: int, **payload: Any) -> Command:
    return Command.new(kind, MEMBER, payload, version=version, now_ns=time.time_ns(), ttl_s=60)


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    api = FakeKubernetes().start()
    api.put(pod("w-1", "prefill"))
    try:
        yield api
    finally:
        api.stop()


@pytest.mark.integration
def test_the_sim_worker_command_relabels_its_pod_and_drains_its_readiness(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    plane = FakeControlPlane(commands=[])
    port, ready_port = free_port(), free_port()
    ready_url = f"http://127.0.0.1:{ready_port}"
    log = tmp_path / "worker.log"

    def acked(n: int) -> bool:
        return len(plane.acks) >= n

    with serving_plane(plane) as cp_url, log.open("wb") as out:
        argv = [sys.executable, "-m", "goodput", "worker", "--engine", "sim",
                "--port", str(port), "--ready-port", str(ready_port), "--role", "prefill",
                "--sim-config", "jitter=0", "--control-plane", cp_url, "--agent-key", "gp_agent",
                "--member-id", MEMBER, "--heartbeat-interval-s", "0.1",
                "--kubernetes-relabel", "--pod-name", "w-1", "--pod-namespace", "goodput",
                "--kubernetes-api", fake.url]  # fmt: skip
        proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: probe(ready_url) == (200, "ready\n"), 60, "/ready 200")
            wait_for(lambda: plane.members.get(MEMBER, {}).get("role") == "prefill", 10, "reg")

            # The planner's move: set_role patches the label first, then the ack says done.
            plane.commands = [command(CommandKind.SET_ROLE, 1, role="decode")]
            wait_for(lambda: acked(1), 10, "the set_role ack")
            assert plane.acks[0]["ok"] is True, plane.acks[0]
            assert "pod w-1 labelled goodput.dev/role=decode" in plane.acks[0]["detail"]
            (patch,) = fake.patches
            assert patch["content_type"] == "application/merge-patch+json"
            assert (patch["name"], patch["body"]) == (
                "w-1", {"metadata": {"labels": {"goodput.dev/role": "decode"}}},
            )  # fmt: skip
            assert fake.pods["w-1"]["metadata"]["labels"]["goodput.dev/role"] == "decode"
            wait_for(lambda: plane.members[MEMBER]["role"] == "decode", 10, "the new role")

            # Drain is readiness: 503 while drained, 200 again after resume.
            plane.commands = [command(CommandKind.DRAIN, 1)]
            wait_for(lambda: acked(2), 10, "the drain ack")
            assert probe(ready_url) == (503, "drained\n")
            plane.commands = [command(CommandKind.RESUME, 1)]
            wait_for(lambda: acked(3), 10, "the resume ack")
            assert probe(ready_url) == (200, "ready\n")
            assert [a["ok"] for a in plane.acks] == [True, True, True]
            assert len(fake.patches) == 1  # drain and resume leave the label alone
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
                raise
    # uvicorn shuts down gracefully, then re-raises the signal it caught
    assert code in (0, -signal.SIGTERM), log.read_text()
    assert "Traceback" not in log.read_text()
    assert probe(ready_url)[0] == 0  # the readiness server stopped with the worker


@pytest.mark.integration
def test_ready_follows_start_drain_with_a_request_in_flight_resume_and_stop(
    tmp_path: Path,
) -> None:
    port = free_port()
    spec = SimWorkerSpec(port=port, sim_config="jitter=0", role=PoolRole.DECODE)
    engine, settings, handoff, control = build_worker(spec)
    ready = ReadinessServer(lambda: control.state, host="127.0.0.1", port=0)
    ready.start()
    app_ = create_app(engine, settings, handoff, control)
    server = uvicorn.Server(uvicorn.Config(app_, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    try:
        assert probe(ready.url) == (503, "starting\n")  # the engine has not started
        thread.start()
        wait_for(lambda: server.started, 30, "the sim worker")
        assert probe(ready.url) == (200, "ready\n")

        first_chunk, done = threading.Event(), threading.Event()
        body = {"model": settings.served_model_name, "prompt": "hello " * 20,
                "max_tokens": 300, "ignore_eos": True, "stream": True}  # fmt: skip

        def stream() -> None:
            with (
                httpx.Client(base_url=spec.url, timeout=60) as client,
                client.stream("POST", "/v1/completions", json=body) as response,
            ):
                for _ in response.iter_lines():
                    first_chunk.set()
            done.set()

        threading.Thread(target=stream, daemon=True).start()
        assert first_chunk.wait(30)
        control.apply_command(CommandKind.DRAIN, {})
        assert probe(ready.url) == (503, "draining\n")  # the request still decodes
        assert done.wait(60)
        wait_for(lambda: probe(ready.url) == (503, "drained\n"), 10, "drained")
        control.apply_command(CommandKind.RESUME, {})
        assert probe(ready.url) == (200, "ready\n")
    finally:
        server.should_exit = True
        thread.join(10)
        try:
            assert probe(ready.url) == (503, "down\n")  # the server stopped
        finally:
            ready.stop()


def test_the_sim_command_line_checks_its_kubernetes_options() -> None:
    sim = ["worker", "--engine", "sim", "--port", "8101"]
    alone = runner.invoke(app, [*sim, "--kubernetes-relabel"], env={"POD_NAME": ""})
    no_pod = runner.invoke(
        app,
        [*sim, "--control-plane", "http://cp:8000", "--kubernetes-relabel"],
        env={"POD_NAME": "", "POD_NAMESPACE": ""},
    )
    same_port = runner.invoke(app, [*sim, "--ready-port", "8101"])
    plan = runner.invoke(app, [*sim, "--ready-port", "8001", "--kubernetes-relabel",
                               "--print-plan"])  # fmt: skip

    assert alone.exit_code == 2
    assert "--kubernetes-relabel needs --control-plane" in alone.output
    assert no_pod.exit_code == 2
    assert "--kubernetes-relabel needs --pod-name (or POD_NAME) to be set" in no_pod.output
    assert same_port.exit_code == 2
    assert "--ready-port: must differ from --port" in same_port.output
    assert plan.exit_code == 0, plan.output
    shown = json.loads(plan.stdout)
    assert (shown["ready_port"], shown["kubernetes_relabel"]) == (8001, True)
