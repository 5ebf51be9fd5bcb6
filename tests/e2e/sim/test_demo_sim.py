"""`goodput demo --engine sim` (what `make demo ENGINE=sim` runs), as a user runs it: the
control-loop scenario on sim workers shows an admission action and a planner move with
their effect (tests/e2e/demo_loop.py), and it stops with no process left."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.demo_loop import check_loop_output
from tests.e2e.test_demo import alive, descendants

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_the_sim_demo_reports_goodput_and_leaves_no_process(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "goodput", "demo", "--engine", "sim", "--duration", "45",
         "--dir", str(tmp_path / "demo"), "--port", "0", "--interval", "5"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    family: set[int] = set()
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        lines.extend(line.rstrip("\n") for line in process.stdout)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    try:
        while process.poll() is None:
            family |= descendants(process.pid)
            assert time.monotonic() < deadline, "\n".join(lines)
            time.sleep(0.5)
        reader.join(10)
    finally:
        if process.poll() is None:
            process.kill()
    output = "\n".join(lines)
    assert process.returncode == 0, output
    assert "h100-llama3.1-8b sim prefill + 2 decode" in output
    check_loop_output(lines)
    assert len(family) >= 6, family  # control plane, three workers, two gateways
    assert not [pid for pid in family if alive(pid)], output
