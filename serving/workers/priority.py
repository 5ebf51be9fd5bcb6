"""The CPU priority and placement of a running server's whole process group:
:func:`lower_priority`, :func:`pin_group`.

On a machine where engines share cores with the gateway and clients, a busy engine delays
them, and their clocks are what goodput is measured with (docs/serving.md, "CPU priority").
Two settings, because a niceness alone is not enough on Linux: with the scheduler's
autogroups (``/proc/sys/kernel/sched_autogroup_enabled``, on by default in most
distributions) each session is one scheduling group with an equal share, and a thread's
niceness weighs only against the threads of its own session. So this sets the niceness of
every thread of every process in the group (threads and processes started later inherit
it) *and*, when the group's leader leads its own session, that session's autogroup
niceness (``/proc/PID/autogroup``). Lowering a priority needs no privilege.

A niceness sets a share, not a latency: a task that wakes still waits for a busy
lower-priority one (4–10 ms at a time on this machine). With ``sched_idle`` the threads
also move to ``SCHED_IDLE``; the kernel compares sessions' groups before their threads,
though, so a task of another session can still wait for it (up to 11 ms seen; it cut a nice-0
probe's wake-ups more than 4 ms late from 313 to 57 in one run). Where a clock must not
wait, give it a core of its own: :func:`pin_group` moves a group's threads.

:class:`~serving.workers.launcher.VllmServer` calls it once the server is ready: start-up
(loading, profiling, warming) runs at normal priority, so a busy machine does not stretch it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

__all__ = ["MAX_NICE", "group_affinity", "lower_priority", "pin_group"]

MAX_NICE = 19
_PROC = Path("/proc")


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            # Fields after the command's closing parenthesis: state, ppid, pgrp, ...
            if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
                members.append(int(entry.name))
    return members


def lower_priority(pgid: int, nice: int, *, sched_idle: bool = False) -> int:
    """Run process group ``pgid`` at niceness ``nice``, and under ``SCHED_IDLE`` when
    ``sched_idle`` (see the module); the number of threads changed. Never raises a priority;
    a process that exits meanwhile is skipped. Linux only (elsewhere: the group leader's
    niceness alone)."""
    if not 0 <= nice <= MAX_NICE:
        raise ValueError(f"nice must be in 0..{MAX_NICE}, got {nice}")
    if not _PROC.is_dir():
        with contextlib.suppress(OSError):
            if os.getpriority(os.PRIO_PROCESS, pgid) < nice:
                os.setpriority(os.PRIO_PROCESS, pgid, nice)
                return 1
        return 0
    changed = 0
    for tid in _group_threads(pgid):
        with contextlib.suppress(OSError):
            lowered = False
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                lowered = True
            if sched_idle and os.sched_getscheduler(tid) != os.SCHED_IDLE:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                lowered = True
            changed += lowered
    with contextlib.suppress(OSError):
        if os.getsid(pgid) == pgid:  # its own session: the autogroup is the group's alone
            _set_autogroup(pgid, nice)
    return changed


def _set_autogroup(pid: int, nice: int) -> None:
    # Unprivileged writers get EAGAIN within 100 ms of any other autogroup change.
    for _ in range(20):
        try:
            (_PROC / str(pid) / "autogroup").write_text(str(nice))
            return
        except FileNotFoundError:
            return  # a kernel without autogroups
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                raise
            time.sleep(0.11)


def _group_threads(pgid: int) -> list[int]:
    threads = []
    for pid in _group_members(pgid):
        with contextlib.suppress(OSError, ValueError):
            threads += [int(task.name) for task in (_PROC / str(pid) / "task").iterdir()]
    return threads


def group_affinity(pgid: int) -> dict[int, set[int]]:
    """The CPUs each thread of process group ``pgid`` may run on (Linux), by thread id."""
    found = {}
    for tid in _group_threads(pgid):
        with contextlib.suppress(OSError):
            found[tid] = os.sched_getaffinity(tid)
    return found


def pin_group(pgid: int, cpus: set[int] | dict[int, set[int]]) -> int:
    """Confine every thread of process group ``pgid`` to ``cpus`` (threads and processes
    started later inherit it); or, given what :func:`group_affinity` returned, give each
    thread its CPUs back (threads started since get all the CPUs named there). The number
    of threads changed. No privilege needed for one's own processes; a thread that exits
    meanwhile is skipped."""
    fallback = set().union(*cpus.values()) if isinstance(cpus, dict) else cpus
    changed = 0
    for tid in _group_threads(pgid):
        wanted = cpus.get(tid, fallback) if isinstance(cpus, dict) else cpus
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, wanted)
            changed += 1
    return changed
