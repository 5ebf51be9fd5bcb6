"""Run ``goodput gateway`` as a child process: for the demo stack, benchmarks and e2e tests.

A :class:`~serving.process.ChildProcess`: in its own session (process group), its output
appended to ``log_path``; :meth:`~serving.process.ChildProcess.stop` sends SIGTERM (uvicorn
shuts down gracefully and the exporter flushes its records), then SIGKILL to the whole group
after the timeout. With ``die_with_parent`` (default) it also gets SIGTERM when the thread
that started it ends — a test run or demo killed outright leaves no gateway behind.

Example::

    gateway = GatewayProcess(["--prefill", p_url, "--decode", d_url], log_path=tmp / "gw.log")
    gateway.start()
    gateway.wait_ready(timeout_s=60)
    ...  # POST gateway.url + "/v1/completions"
    gateway.stop()
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from serving.process import ChildProcess, free_port

__all__ = ["GatewayProcess", "free_port"]


class GatewayProcess(ChildProcess):
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
        argv = [sys.executable, "-m", "goodput", "gateway", "--host", host,
                "--port", str(self.port), *args]  # fmt: skip
        super().__init__(argv, log_path=log_path, env=env, die_with_parent=die_with_parent)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Poll ``/health`` until 200; :class:`~serving.process.ChildError` (a
        ``RuntimeError``) with the log's tail otherwise."""
        self.wait_http(self.url + "/health", "the gateway", timeout_s=timeout_s, every_s=0.1)
