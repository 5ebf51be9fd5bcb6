"""Run ``goodput gateway`` as a child process: for the demo stack, benchmarks and e2e tests.

The gateway runs in its own session (process group), its output appended to ``log_path``;
:meth:`GatewayProcess.stop` sends SIGTERM (uvicorn shuts down gracefully and the exporter
flushes its records), then SIGKILL to the whole group after the timeout. With
``die_with_parent`` (default) it also gets SIGTERM when the thread that started it ends —
a test run or demo killed outright leaves no gateway behind (Linux; the exec wrapper of
:mod:`serving.workers._exec_child`).

Example::

    gateway = GatewayProcess(["--prefill", p_url, "--decode", d_url], log_path=tmp / "gw.log")
    gateway.start()
    gateway.wait_ready(timeout_s=60)
    ...  # POST gateway.url + "/v1/completions"
    gateway.stop()
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from serving.workers.config import EXEC_CHILD_MODULE

__all__ = ["GatewayProcess", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class GatewayProcess:
    """``python -m goodput gateway --host HOST --port PORT ARGS...`` (see the module)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        log_path: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        wrapper = ["-m", EXEC_CHILD_MODULE, "--parent", str(os.getpid()), "--", sys.executable]
        self.argv = [sys.executable, *(wrapper if die_with_parent else []), "-m", "goodput",
                     "gateway", "--host", host, "--port", str(self.port), *args]  # fmt: skip
        self.log_path = log_path
        self.env = dict(env if env is not None else os.environ)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Poll ``/health`` until 200; ``RuntimeError`` with the log's tail otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise RuntimeError(f"the gateway exited before it was ready:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the gateway was not ready within {timeout_s:g} s:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL to the group after ``timeout_s``; idempotent."""
        process = self.process
        if process is None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
            try:
                process.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
