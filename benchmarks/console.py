"""The console with 1,000 SLOs in real Chromium, and the overview's API.

Starts ``goodput controlplane serve`` on a fresh SQLite file, applies 1,000 SLOs (one
import), keeps a real exporter sending finished requests to a rotating tenth of them, then:

* ``api_1000_slos_ms``: median of ``GET /api/v1/goodput/summary`` (what the overview
  reads; ``api_1000_slos_cold_ms`` is the first call, which computes every row and the
  sparklines; ``api_goodput_1000_slos_ms`` / ``_kb`` the full ``GET /api/v1/goodput`` for
  comparison);
* ``overview_1000_slos_ms``: navigation start to the 1,000th row in the DOM (median of runs);
* ``sse_to_paint_ms_p50/p99``: an SSE event's arrival to the next frame after it is
  applied (``performance.measure("sse-to-paint")`` in ``overview.js``);
* ``page_kb``: bytes transferred (compressed) by the overview's first load, the event
  stream excluded: it starts from the rows of that load (``?since=``), so its first event
  carries only what changed since.

Run from the repo root: ``python benchmarks/console.py [--quick]``; the last line printed
is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporters.recorder import RequestRecorder
from exporters.records import Labels, Status, Vantage
from exporters.transport import ControlPlaneExporter
from goodput._demo_processes import ChildProcess, pick_port, run_cli

HOST = "127.0.0.1"
NUM_SLOS = 1000


def slo_yaml(n: int) -> str:
    docs = [
        f"name: slo-{i:04d}\nselector: {{model: m{i % 20}, tenant: t{i}}}\ntarget: 0.99\n"
        "window_s: 86400\nobjectives: [{metric: ttft, threshold_s: 0.2}]\n"
        for i in range(n)
    ]
    return "---\n".join(docs)


def feed(url: str, key: str, stop: threading.Event) -> None:
    """Requests for a rotating tenth of the SLOs, a third of them bad, until ``stop``."""
    exporter = ControlPlaneExporter(url, api_key=key, flush_interval_s=0.1)
    recorder = RequestRecorder(Vantage.GATEWAY, exporter)
    k = 0
    while not stop.is_set():
        for i in range(k % 10, NUM_SLOS, 10):
            trace = recorder.start(f"b{k}-{i}", Labels(model=f"m{i % 20}", tenant=f"t{i}"))
            trace.token()
            trace.finish(Status.ERROR if (i + k) % 3 == 0 else Status.OK)
        k += 1
        stop.wait(0.25)
    exporter.shutdown(timeout_s=5.0)


def timed_get(client: httpx.Client, path: str, runs: int) -> tuple[float, float, int]:
    """(first call ms, median ms of the rest, body bytes)."""
    times, size = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200, response.text
        size = len(response.content)
    return times[0], statistics.median(times[1:]), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs and stream events")
    args = parser.parse_args()
    runs, events = (3, 20) if args.quick else (7, 60)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GOODPUT_DATABASE_URL": f"sqlite:///{tmp}/goodput.db"}
        run_cli(env, "db", "upgrade")
        create = ("admin", "create-key", "--role")
        keys = {
            r: run_cli(env, *create, r, "--name", f"bench-{r}").strip()
            for r in ("operator", "ingest")
        }
        port = pick_port(HOST, 0)
        url = f"http://{HOST}:{port}"
        server = ChildProcess(
            [sys.executable, "-m", "goodput", "controlplane", "serve", "--no-migrate",
             "--host", HOST, "--port", str(port)],
            {**env, "GOODPUT_PLANNER_ENABLED": "false", "GOODPUT_ADMISSION_ENABLED": "false"},
            Path(tmp) / "cp.log",
        )  # fmt: skip
        stop = threading.Event()
        try:
            server.wait_http(f"{url}/ready", "control plane", timeout_s=60.0)
            headers = {"Authorization": f"Bearer {keys['operator']}"}
            with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
                imported = client.post(
                    "/api/v1/slos:import",
                    content=slo_yaml(NUM_SLOS),
                    headers={"Content-Type": "application/yaml"},
                )
                assert imported.status_code == 200, imported.text
                # Reading one SLO's goodput makes the engine load the new set at once (it
                # would within slo_poll_interval_s): the summary then has every row.
                last = client.get(f"/api/v1/slos/slo-{NUM_SLOS - 1:04d}/goodput")
                assert last.status_code == 200, last.text
                feeder = threading.Thread(target=feed, args=(url, keys["ingest"], stop))
                feeder.start()
                time.sleep(3.0)
                cold, api_ms, api_bytes = timed_get(client, "/api/v1/goodput/summary", runs * 3)
                count = client.get("/api/v1/goodput/summary").json()["count"]
                assert count == NUM_SLOS, f"the summary has {count} rows, not {NUM_SLOS}"
                _, full_ms, full_bytes = timed_get(client, "/api/v1/goodput", runs)
            result = browse(url, keys["operator"], runs, events)
        finally:
            stop.set()
            server.stop(timeout_s=10.0)
    result.update(
        api_1000_slos_ms=round(api_ms, 1),
        api_1000_slos_cold_ms=round(cold, 1),
        api_1000_slos_kb=round(api_bytes / 1024, 1),
        api_goodput_1000_slos_ms=round(full_ms, 1),
        api_goodput_1000_slos_kb=round(full_bytes / 1024, 1),
        load_average_1m=round(os.getloadavg()[0], 2),
    )
    print(json.dumps(result))


def browse(url: str, key: str, runs: int, events: int) -> dict[str, float]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(f"{url}/console/sign-in")
        page.get_by_label("API key").fill(key)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{url}/console/")
        loads, page_bytes = [], 0
        for _ in range(runs):
            page.goto(f"{url}/console/")
            # A selector, not wait_for_function: the console's CSP forbids eval.
            page.locator("tr[data-slo]").nth(NUM_SLOS - 1).wait_for(state="attached")
            loads.append(page.evaluate("performance.now()"))
            marks = page.evaluate(
                "performance.getEntriesByType('mark').map(m => [m.name, Math.round(m.startTime)])"
            )
            print(f"load {loads[-1]:.0f} ms, marks {marks}", file=sys.stderr)
            page_bytes = page.evaluate(
                """() => performance.getEntriesByType('navigation')[0].transferSize +
                   performance.getEntriesByType('resource')
                     .filter(r => !r.name.includes('/stream'))
                     .reduce((sum, r) => sum + r.transferSize, 0)"""
            )
        # Events come once a second, later when the machine is busy: wait for ``events``
        # of them, at most four times as long as that should take.
        deadline = time.monotonic() + events * 4
        paints: list[float] = []
        while time.monotonic() < deadline and len(paints) <= events:
            page.wait_for_timeout(1000)
            paints = page.evaluate(
                "performance.getEntriesByName('sse-to-paint').map(m => m.duration)"
            )
        assert paints, "no SSE update reached the page"
        browser.close()
    paints.sort()
    return {
        "overview_1000_slos_ms": round(statistics.median(loads), 1),
        "sse_to_paint_ms_p50": round(statistics.median(paints), 1),
        "sse_to_paint_ms_p99": round(paints[min(len(paints) - 1, int(len(paints) * 0.99))], 1),
        "page_kb": round(page_bytes / 1024, 1),
        "sse_events": len(paints),
    }


if __name__ == "__main__":
    main()
