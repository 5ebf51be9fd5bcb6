"""``goodput demo --engine vllm`` (what ``make demo`` runs), as a user runs it: the control
plane, a vLLM prefill and two decode workers and the PD gateways start; the scenario
overloads them without control, then with the loops on, and shows at least one admission
action and one planner move with their effect (tests/e2e/demo_loop.py); within its default
duration every process it started is gone.

The demo starts vLLM instances of its own, and this machine holds only a few at a time:
the test runs last in the session (``conftest.pytest_collection_modifyitems``) and stops
the session's PD pair first, if one was started.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.demo_loop import check_loop_output
from tests.e2e.test_demo import descendants

from .conftest import stop_pd_pairs

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

REPO_ROOT = Path(__file__).resolve().parents[3]
DEADLINE_S = 900  # start-up of three engines on a busy 2-core machine, the scenario, the stop


def start_time(pid: int) -> str | None:
    """The process's start time (``/proc/PID/stat`` field 22), or ``None`` once it is gone
    or a zombie: with the pid, it names one process even if the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


def test_the_vllm_demo_reports_goodput_and_leaves_no_process(tmp_path: Path) -> None:
    stop_pd_pairs()
    process = subprocess.Popen(
        [sys.executable, "-m", "goodput", "demo", "--engine", "vllm",
         "--dir", str(tmp_path / "demo"), "--port", "0"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    family: dict[int, str] = {}
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        lines.extend(line.rstrip("\n") for line in process.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + DEADLINE_S
    try:
        while process.poll() is None:
            for pid in descendants(process.pid) - family.keys():
                if (started := start_time(pid)) is not None:
                    family[pid] = started
            assert time.monotonic() < deadline, "\n".join(lines)
            time.sleep(0.5)
        reader.join(10)
    finally:
        if process.poll() is None:
            process.kill()
    output = "\n".join(lines)
    assert process.returncode == 0, output
    assert "the full stack (control plane, vLLM prefill + 2 decode, PD gateways)" in output
    check_loop_output(lines)
    print("\n".join(lines[-16:]))  # the comparison
    # The control plane, three workers and their vLLM servers, two gateways.
    assert len(family) >= 9, family
    left = [pid for pid, started in family.items() if start_time(pid) == started]
    assert not left, f"still running: {left}\n{output}"
