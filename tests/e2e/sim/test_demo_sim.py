"""`goodput demo --engine sim` (what `make demo ENGINE=sim` runs), as a user runs it: it
prints live goodput lines with finished requests and stops with no process left."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.test_demo import alive, descendants

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[3]
ROW = re.compile(r"^\s+(\d+) s\s+[\d.]+\s+[\d.]+\s+[\d.]+%.*\s(\d+)\s+(\d+)$")


def test_the_sim_demo_reports_goodput_and_leaves_no_process(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "goodput", "demo", "--engine", "sim", "--duration", "20",
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
    assert "h100-llama3.1-8b sim prefill + decode" in output
    rows = [m for line in lines if (m := ROW.match(line))]
    assert rows, output
    finished, failed = int(rows[-1][2]), int(rows[-1][3])
    assert finished > 0 and failed == 0, output
    assert "goodput demo: stopped every process it started" in output
    assert len(family) >= 4, family  # control plane, two workers, gateway
    assert not [pid for pid in family if alive(pid)], output
