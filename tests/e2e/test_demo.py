"""`goodput demo` as a user runs it: real processes, real HTTP, a temporary folder.

Each test starts the demo, reads the URL and the viewer key it prints, asks the control
plane itself for the demo SLO's goodput while the replay runs, then checks that the demo
stops (at the end of ``--duration``, or on SIGINT as from Ctrl-C) and that every process it
started is gone.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_TIMEOUT_S = 180.0  # migrations, keys, SLO and server start on a busy 2-core machine
WATCH = re.compile(r"^Live goodput: (?P<url>http://\S+)$")
KEY = re.compile(r"Bearer (?P<key>gp_[A-Za-z0-9_\-]+)")


def _process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) for every process, from /proc."""
    table: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone while we looked
        # The command name is in parentheses and may hold spaces: split after the last ')'.
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        table[int(entry.name)] = (int(ppid), state)
    return table


def descendants(pid: int) -> set[int]:
    table = _process_table()
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, (ppid, _) in table.items() if ppid == parent and p not in found]
        found.update(children)
        frontier.extend(children)
    return found


def alive(pid: int) -> bool:
    """Running (a zombie, reaped or not, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class Demo:
    """A ``goodput demo`` child: its output lines, the processes it started, its answers."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "goodput", "demo", "--dir", str(tmp_path / "demo"),
             "--port", "0", "--interval", "2", "--rate-low", "2", "--rate-high", "6",
             "--ramp-period", "10", *args],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # signals reach the demo alone, as a terminal's would first
        )  # fmt: skip
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.family: set[int] = set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def watch(self) -> Iterator[str]:
        """Output lines as they come, until the demo closes its output or the setup timeout."""
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while time.monotonic() < deadline:
            self.family |= descendants(self.process.pid)
            try:
                line = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                return
            self.lines.append(line)
            yield line

    def wait_for_url_and_key(self) -> tuple[str, str]:
        url = key = None
        for line in self.watch():
            if match := WATCH.match(line):
                url = match["url"]
            elif url and (match := KEY.search(line)):
                key = match["key"]
                return url, key
        pytest.fail("the demo printed no URL and key:\n" + "\n".join(self.lines))

    def goodput(self, url: str, key: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """The SLO's stats from the control plane, once it has judged some requests."""
        deadline = time.monotonic() + timeout_s
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            self.family |= descendants(self.process.pid)
            response = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=5.0)
            assert response.status_code == 200, response.text
            body = response.json()
            if body["requests"] > 0:
                return body
            time.sleep(0.5)
        pytest.fail(f"no judged request within {timeout_s} s: {body}")

    def finish(self, timeout_s: float = 60.0) -> int:
        for _ in self.watch():  # drain the output so the demo never blocks on its pipe
            pass
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for pid in self.family:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def check_stats(stats: dict[str, Any]) -> None:
    assert stats["slo_name"] == "demo-chat"
    assert stats["good"] + stats["bad"] == stats["requests"] > 0
    assert stats["goodput_rps"] > 0
    assert 0 < stats["attainment_ratio"] <= 1
    assert stats["ttft"]["p99_s"] > 0 and stats["itl"]["p99_s"] > 0


def test_a_bounded_demo_reports_goodput_and_leaves_no_process(tmp_path: Path) -> None:
    demo = Demo(tmp_path, "--duration", "15")
    try:
        url, key = demo.wait_for_url_and_key()
        assert url.endswith("/api/v1/slos/demo-chat/goodput?window=1m")
        check_stats(demo.goodput(url, key))
        assert demo.family, "the demo started no child process"
        assert demo.finish() == 0, "\n".join(demo.lines)
    finally:
        demo.kill()
    output = "\n".join(demo.lines)
    assert "SLO demo-chat: TTFT ≤ 200 ms and ITL ≤ 50 ms for 99 % of requests" in output
    assert re.search(r"stopped after 15 s; \d+ requests replayed, [1-9]\d* finished", output)
    rows = [line for line in demo.lines if re.match(r"^\s+\d+ s\s+\d", line)]
    assert rows and "%" in rows[-1], output
    assert not [pid for pid in demo.family if alive(pid)]
    with pytest.raises(httpx.ConnectError):
        httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=2.0)


def test_sigint_stops_the_demo_and_everything_it_started(tmp_path: Path) -> None:
    demo = Demo(tmp_path)
    try:
        url, key = demo.wait_for_url_and_key()
        check_stats(demo.goodput(url, key))
        family = set(demo.family)
        demo.process.send_signal(signal.SIGINT)
        assert demo.finish(timeout_s=30.0) == 0, "\n".join(demo.lines)
    finally:
        demo.kill()
    assert "Ctrl-C stops it." in demo.lines
    assert re.search(r"stopped after \d+ s", "\n".join(demo.lines))
    assert family and not [pid for pid in family | demo.family if alive(pid)]
