"""The processes ``goodput demo`` runs: CLI steps to completion, the control plane as a
supervised child, and signals turned into an event. Private to :mod:`goodput.demo`."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["ChildProcess", "DemoError", "pick_port", "run_cli", "signals_set"]

_PR_SET_PDEATHSIG = 1


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and why."""


def run_cli(env: Mapping[str, str], *args: str, timeout_s: float = 120.0) -> str:
    """Run ``python -m goodput ARGS`` to completion: its stdout, or :class:`DemoError` with
    the command and its stderr."""
    argv = [sys.executable, "-m", "goodput", *args]
    try:
        done = subprocess.run(
            argv, env=dict(env), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise DemoError(f"`goodput {shlex.join(args)}` took more than {timeout_s:g} s") from None
    if done.returncode != 0:
        raise DemoError(
            f"`goodput {shlex.join(args)}` failed with exit code {done.returncode}: "
            f"{done.stderr.strip()[-2000:]}"
        )
    return done.stdout


def _set_parent_death_signal() -> None:  # runs in the forked child, before exec
    # Linux: the child gets SIGTERM when the thread that forked it (the demo's main thread)
    # ends, so even a demo killed with SIGKILL leaves no control plane behind.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildProcess:
    """A long-lived child in its own session, its output appended to ``log_path``.

    Its own session, so that a terminal's Ctrl-C reaches the demo alone and the demo stops
    things in order; :meth:`stop` then ends the child's whole process group. Start it from
    the main thread before any other thread exists (the parent-death signal is tied to the
    forking thread, and ``preexec_fn`` is unsafe once threads run).
    """

    def __init__(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_set_parent_death_signal if sys.platform == "linux" else None,  # noqa: PLW1509
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
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
        first. :class:`DemoError` naming ``what`` and the log when the child exits or
        ``timeout_s`` passes (a refused or timed-out poll only means not ready yet)."""
        import httpx

        stop = stop or threading.Event()
        deadline = time.monotonic() + timeout_s
        while not stop.is_set():
            if not self.alive():
                raise DemoError(f"{what} exited (log {self.log_path}):\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return True
            if time.monotonic() > deadline:
                raise DemoError(
                    f"{what} was not ready within {timeout_s:g} s (log {self.log_path})"
                )
            stop.wait(every_s)
        return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the group (uvicorn shuts down gracefully), SIGKILL it after the timeout."""
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        # The leader is gone; end any straggler left in its group too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


def pick_port(host: str, wanted: int) -> int:
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


@contextlib.contextmanager
def signals_set(event: threading.Event) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM set ``event`` instead of ending the process
    (main thread only); the previous handlers come back after it."""

    def handler(signum: int, frame: object) -> None:
        event.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
