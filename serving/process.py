"""Child processes: the one way the project starts a long-lived process (a vLLM server, a
gateway, the demo's control plane, Prometheus) and makes sure it does not outlive us.

A :class:`ChildProcess` runs in its own session (process group), so that a terminal's
Ctrl-C reaches the parent alone and the parent stops things in order; its output is
appended to ``log_path``. :meth:`~ChildProcess.stop` sends SIGTERM to the whole group
(uvicorn and vLLM shut down gracefully), then SIGKILL after the timeout, so no grandchild
(vLLM's engine core) is left behind.

**Parent death.** With ``die_with_parent`` (default) the command runs through the exec
wrapper :mod:`serving._exec_child`: it sets Linux's parent-death signal (SIGTERM) and then
execs the command, so the child ends when the *thread* that started it ends — even a parent
killed with SIGKILL leaves nothing behind. Start children from a long-lived thread. (A
``preexec_fn`` would do the same without the wrapper, but is unsafe once threads run.)

Example::

    child = ChildProcess(["prometheus", "--config.file=p.yml"], log_path=tmp / "prom.log")
    child.start()
    child.wait_http("http://127.0.0.1:9090/-/ready", "prometheus", timeout_s=30)
    ...
    child.stop()
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

__all__ = ["EXEC_CHILD_MODULE", "ChildError", "ChildProcess", "dies_with_parent", "free_port"]

EXEC_CHILD_MODULE = "serving._exec_child"


class ChildError(RuntimeError):
    """A child exited or did not become ready; the message names it and carries its log."""


def dies_with_parent(
    argv: Sequence[str], *, parent_pid: int | None = None, python: str | None = None
) -> list[str]:
    """``argv`` run through the exec wrapper, so that it ends when the thread of
    ``parent_pid`` (default: this process) that starts it ends."""
    parent = os.getpid() if parent_pid is None else parent_pid
    wrapper = [python or sys.executable, "-m", EXEC_CHILD_MODULE, "--parent", str(parent)]
    return [*wrapper, "--", *argv]


def free_port(host: str = "127.0.0.1", wanted: int = 0) -> int:
    """``wanted`` when it is free (``0``: any free port), else a free port chosen by the OS."""
    if wanted:
        with socket.socket() as probe:
            try:
                probe.bind((host, wanted))
                return wanted
            except OSError:
                pass
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


class ChildProcess:
    """One child process (see the module docstring). ``start`` after it ended starts a fresh
    one with the same command. ``error`` is what :meth:`wait_http` raises (a subclass may
    name its own)."""

    error: type[Exception] = ChildError

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env = dict(env if env is not None else os.environ)
        self.cwd = cwd
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def start(self) -> None:
        """Start the command (through the exec wrapper with ``die_with_parent``)."""
        argv = dies_with_parent(self.argv) if self.die_with_parent else self.argv
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                env=self.env,
                cwd=self.cwd,
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

    def wait_http(
        self,
        url: str,
        what: str,
        *,
        timeout_s: float,
        stop: threading.Event | None = None,
        every_s: float = 0.2,
    ) -> bool:
        """Poll ``url`` until it answers 200: ``True`` then, ``False`` when ``stop`` was set
        first. :attr:`error` naming ``what`` and the log when the child exits or
        ``timeout_s`` passes (a refused or timed-out poll only means not ready yet)."""
        stop = stop or threading.Event()
        deadline = time.monotonic() + timeout_s
        while not stop.is_set():
            if not self.alive():
                raise self.error(f"{what} exited (log {self.log_path}):\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return True
            if time.monotonic() > deadline:
                raise self.error(
                    f"{what} was not ready within {timeout_s:g} s (log {self.log_path}):\n"
                    f"{self.log_tail()}"
                )
            stop.wait(every_s)
        return False

    def signal_group(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the child's whole process group (its id is the child's pid; it
        outlives the leader while a grandchild still runs)."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole group (what a crash looks like) and reap the child."""
        self.signal_group(signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> bool:
        """SIGTERM the group, SIGKILL it after ``timeout_s``; ``True`` when the child ended
        on SIGTERM. Idempotent."""
        if self.process is None:
            return True
        self.signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
            graceful = True
        except subprocess.TimeoutExpired:
            graceful = False
        self.kill()  # the leader is gone or stuck; end any straggler in its group too
        return graceful
