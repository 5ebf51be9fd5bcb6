"""The exec wrapper and the priority of a running process group, with real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving._exec_child import main
from serving.workers.priority import group_affinity, lower_priority, pin_group

REPO = Path(__file__).parents[4]
# A process with a second thread and a child process, all in one new session.
FAMILY = (
    "import subprocess, sys, threading, time\n"
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print('up', flush=True)\n"
    "time.sleep(60)\n"
)


def threads(pgid: int) -> list[int]:
    """Every thread of every process in group ``pgid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
                found += [int(t.name) for t in (entry / "task").iterdir()]
        except (OSError, ValueError):
            continue
    return found


def nices(pgid: int) -> list[int]:
    return [os.getpriority(os.PRIO_PROCESS, tid) for tid in threads(pgid)]


def policies(pgid: int) -> set[int]:
    return {os.sched_getscheduler(tid) for tid in threads(pgid)}


@pytest.fixture
def family() -> Iterator[subprocess.Popen[str]]:
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc (Linux)")
    process = subprocess.Popen(
        [sys.executable, "-c", FAMILY], stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None and process.stdout.readline() == "up\n"
    try:
        yield process
    finally:
        os.killpg(process.pid, 9)
        process.wait(10)


def test_lower_priority_reaches_every_thread_and_the_sessions_autogroup(
    family: subprocess.Popen[str],
) -> None:
    before = nices(family.pid)
    assert len(before) >= 3  # main thread, its sleeper, the child
    changed = lower_priority(family.pid, 10)
    assert changed == sum(n < 10 for n in before)
    assert nices(family.pid) == [max(10, n) for n in before]
    group = Path(f"/proc/{family.pid}/autogroup")
    if group.exists():  # Linux with autogroups: the family leads its own session
        assert group.read_text().split()[-1] == "10"
    assert lower_priority(family.pid, 5) == 0  # never raised back


def test_sched_idle_reaches_every_thread_and_only_when_asked(
    family: subprocess.Popen[str],
) -> None:
    lower_priority(family.pid, 10)
    assert policies(family.pid) == {os.SCHED_OTHER}

    changed = lower_priority(family.pid, 10, sched_idle=True)

    assert changed >= 3  # main thread, its sleeper, the child: niceness already 10
    assert policies(family.pid) == {os.SCHED_IDLE}
    assert lower_priority(family.pid, 10, sched_idle=True) == 0


def test_pin_group_moves_every_thread_and_puts_each_back(
    family: subprocess.Popen[str],
) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    saved = group_affinity(family.pid)
    assert set(saved) == set(threads(family.pid))

    assert pin_group(family.pid, {cpus[-1]}) == len(saved)
    assert all(os.sched_getaffinity(tid) == {cpus[-1]} for tid in threads(family.pid))

    pin_group(family.pid, saved)
    assert group_affinity(family.pid) == saved


def test_lower_priority_refuses_a_niceness_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"nice must be in 0\.\.19, got 20"):
        lower_priority(os.getpid(), 20)


def test_the_wrapper_execs_the_command_in_place() -> None:
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "serving._exec_child", "--parent", str(os.getpid()),
         "--", sys.executable, "-c", "import os; print(os.getpid())"],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    out, _ = wrapper.communicate(timeout=60)
    assert wrapper.returncode == 0 and int(out) == wrapper.pid  # same process, exec'd


def test_the_wrapper_refuses_a_dead_parent() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "serving._exec_child", "--parent", "1", "--", "true"],
        cwd=REPO, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and time.monotonic() - started < 60


@pytest.mark.parametrize(
    "argv", [[], ["--parent", "1", "--"], ["1", "--", "true"], ["--parent", "x", "--", "true"]]
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith("usage: python -m serving._exec_child")
