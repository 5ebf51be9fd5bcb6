"""The exec wrapper in a real child process: the niceness and the session's autogroup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from serving.workers._exec_child import main

SHOW = (
    "import os, pathlib\n"
    "group = pathlib.Path('/proc/self/autogroup')\n"
    "print(os.getpriority(os.PRIO_PROCESS, 0), group.read_text().split()[-1] "
    "if group.exists() else '-')\n"
)


def run(*wrapper: str, new_session: bool = True) -> list[str]:
    argv = [sys.executable, "-m", "serving.workers._exec_child", *wrapper, "--",
            sys.executable, "-c", SHOW]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=True,
        start_new_session=new_session, cwd=Path(__file__).parents[4],
    )  # fmt: skip
    return done.stdout.split()


def test_nice_lowers_the_process_and_its_own_sessions_autogroup() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    nice, group = run("--nice", "10")
    assert int(nice) == max(10, base)
    if Path("/proc/self/autogroup").exists():  # Linux with autogroups
        assert group == "10"


def test_a_child_in_its_callers_session_leaves_the_autogroup_alone() -> None:
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("no scheduler autogroups on this kernel")
    mine = Path("/proc/self/autogroup").read_text().split()[-1]
    nice, group = run("--nice", "5", new_session=False)
    assert int(nice) >= 5
    assert group == mine  # the caller's group is shared: never changed from a child


def test_parent_only_execs_unchanged() -> None:
    nice, _ = run("--parent", str(os.getpid()))
    assert int(nice) == os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.parametrize(
    "argv",
    [[], ["--", ], ["--nice", "20", "--", "true"], ["--nice", "-1", "--", "true"],
     ["--bogus", "1", "--", "true"], ["--nice", "--", "true"], ["x", "--", "true"]],
)  # fmt: skip
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith("usage: python -m serving.workers._exec_child")
