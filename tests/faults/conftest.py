"""Fault injection: a real control plane (``goodput controlplane serve``, uvicorn, SQLite in
a temporary folder) that a test can ``kill -9`` and start again on the same database and
port, with keys and an SLO made by the CLI as a user would.

Every test here is marked ``faults`` and bounded in time (each wait has a deadline).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
SLO_YAML = """\
name: all
selector: {model: llama}
objectives:
  - {metric: ttft, threshold_s: 5.0}
target: 0.9
window_s: 86400
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ControlPlane:
    """One control plane's folder, port and keys; :meth:`start`, :meth:`kill` (SIGKILL),
    :meth:`stop` (SIGTERM)."""

    folder: Path
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "goodput", *args],
            env=self.env, cwd=ROOT, check=True, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return done.stdout.strip()

    def prepare(self, **settings: str) -> ControlPlane:
        self.env = {
            **os.environ,
            "GOODPUT_DATABASE_URL": f"sqlite:///{self.folder / 'goodput.db'}",
            "GOODPUT_LOG_LEVEL": "WARNING",
            "GOODPUT_PLANNER_ENABLED": "false",
            "GOODPUT_ADMISSION_ENABLED": "false",
            **{f"GOODPUT_{k.upper()}": v for k, v in settings.items()},
        }
        self.cli("db", "upgrade")
        for role in ("admin", "ingest"):
            self.keys[role] = self.cli("admin", "create-key", "--role", role, "--name", role)
        (self.folder / "slos.yaml").write_text(SLO_YAML)
        self.cli("slo", "apply", "-f", str(self.folder / "slos.yaml"))
        return self

    def start(self, timeout_s: float = 60.0) -> ControlPlane:
        log = (self.folder / "controlplane.log").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "goodput", "controlplane", "serve", "--no-migrate",
             "--port", str(self.port)],
            env=self.env, cwd=ROOT, stdout=log, stderr=log,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.folder / "controlplane.log").read_text()
            try:
                if httpx.get(f"{self.url}/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("the control plane did not become ready")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def admin(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.keys['admin']}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)

    def requests_counted(self) -> int:
        with self.admin() as http:
            response = http.get("/api/v1/slos/all/goodput", params={"window": "1h"})
            response.raise_for_status()
            count: int = response.json()["requests"]
            return count


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path)
    try:
        yield plane
    finally:
        plane.stop()
