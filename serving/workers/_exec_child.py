"""Exec a command after two process settings that must be made in the child itself:

    python -m serving.workers._exec_child [--parent PID] [--nice N] -- PROGRAM [ARGS...]

``--parent PID``: the command dies with its parent. Linux's parent-death signal
(``prctl(PR_SET_PDEATHSIG)``) survives ``execve``, so setting it here and then exec'ing the
real command (the vLLM server) means a supervisor killed with SIGKILL leaves no server
behind. Doing it in a ``preexec_fn`` instead would be unsafe: the supervisor forks from
threads. Elsewhere than Linux this part does nothing.

``--nice N`` (0..19): the command runs at a lower CPU scheduling priority, so that on a
machine it shares with latency-critical processes (the gateway, a benchmark client) a
busy engine does not delay them. Two settings, because a niceness alone is not enough on
Linux: with the scheduler's autogroups (``/proc/sys/kernel/sched_autogroup_enabled``, on by
default in most distributions) each session is one scheduling group, and a process's
niceness weighs only against the other processes of its own session. So it sets the
niceness of this process (inherited by everything the command starts) *and*, when this
process leads its own session (the launcher starts it with ``start_new_session``), the
niceness of that session's autogroup (``/proc/self/autogroup``). Lowering a priority needs
no privilege.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_USAGE = (
    "usage: python -m serving.workers._exec_child [--parent PID] [--nice N] -- PROGRAM [ARGS...]\n"
)
MAX_NICE = 19


def lower_priority(nice: int) -> None:
    """Run this process (and what it starts) at niceness ``nice``; see the module."""
    # Never below what we already have (that would be a raise, which needs privilege).
    nice = max(nice, os.getpriority(os.PRIO_PROCESS, 0))
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    if os.getsid(0) == os.getpid():  # our own session: its autogroup is ours alone
        with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as group:
            group.write(str(nice))


def _die_with(parent: int) -> None:
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        # The parent may have died between fork and prctl: then nobody would signal us.
        if os.getppid() != parent:
            raise SystemExit(1)


def main(argv: list[str]) -> None:
    parent: int | None = None
    nice = 0
    try:
        split = argv.index("--")
        options, command = argv[:split], argv[split + 1 :]
        if not command or len(options) % 2:
            raise ValueError
        for name, value in zip(options[::2], options[1::2], strict=True):
            if name == "--parent":
                parent = int(value)
            elif name == "--nice" and 0 <= int(value) <= MAX_NICE:
                nice = int(value)
            else:
                raise ValueError
    except ValueError:
        sys.stderr.write(_USAGE)
        raise SystemExit(2) from None
    if parent is not None:
        _die_with(parent)
    if nice:
        lower_priority(nice)
    os.execvpe(command[0], command, os.environ)


if __name__ == "__main__":
    main(sys.argv[1:])
