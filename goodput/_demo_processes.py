"""The processes ``goodput demo`` runs: CLI steps to completion, long-lived children
(:class:`serving.process.ChildProcess`, started at once, failing with :class:`DemoError`),
and signals turned into an event. Private to :mod:`goodput.demo`."""

from __future__ import annotations

import contextlib
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from serving import process

__all__ = ["ChildProcess", "DemoError", "pick_port", "run_cli", "signals_set"]

#: A free port: the one wanted when it is free, else one the OS picks.
pick_port = process.free_port


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


class ChildProcess(process.ChildProcess):
    """A long-lived child of the demo, started at once (see :mod:`serving.process`: its own
    session, its output appended to ``log_path``, ended with the thread that started it);
    :meth:`wait_http` fails with :class:`DemoError`."""

    error = DemoError
    process: subprocess.Popen[bytes]  # started in __init__

    def __init__(self, argv: list[str], env: Mapping[str, str], log_path: Path) -> None:
        super().__init__(argv, log_path=log_path, env=env)
        self.start()


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
