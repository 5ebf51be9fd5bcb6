"""GatewayProcess with real processes: a gateway does not outlive the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).parents[4]
# Starts a gateway (colocated, on an upstream nobody serves), prints its pid, then waits to
# be killed.
PARENT = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from serving.gateway.process import GatewayProcess\n"
    "gateway = GatewayProcess(['--colocated', 'http://127.0.0.1:9'], log_path=Path(sys.argv[1]))\n"
    "gateway.start()\n"
    "print(gateway.process.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1].startswith("Z")  # a zombie has ended
    except FileNotFoundError:
        return True


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_gateway_ends_when_its_parent_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "gateway.log")],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert parent.stdout is not None
    gateway_pid = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 20
        while not gone(gateway_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(gateway_pid), (tmp_path / "gateway.log").read_text()
    finally:
        if not gone(gateway_pid):
            os.killpg(gateway_pid, signal.SIGKILL)
