"""Soak: sustained ingest plus admin reads against one control plane, for leaks and loss.

Starts the control plane as a user does (``benchmarks/ingest_http.py``'s server: uvicorn,
SQLite in a temporary folder, durable ingest on, three SLOs), then for ``--duration-s``
(600 s; ``--quick``: 60 s):

* ingest threads send binary wire batches of 512 Azure-conversation requests (one token per
  emission) paced to ``--tokens-per-s`` token timestamps per second (1.2 M), each batch
  under a fresh ``seq``;
* one admin thread reads ``GET /api/v1/slos``, an SLO's goodput and the goodput summary,
  ten times a second, timing each;
* the server's RSS is sampled from ``/proc`` once the warm-up (a tenth of the run, at least
  10 s) is over, and at the end.

Afterwards ``lost`` = records the server acknowledged − records the engine counts (SLO
``everything``, window 1 h). The last line is one JSON object: ``{"records", "lost",
"rss_mb_start", "rss_mb_end", "rss_growth_ratio", "p99_admin_ms", "errors", ...}``.
Goals (issue 15): ``lost`` 0, ``errors`` 0, RSS growth ≤ 10 % after warm-up, admin p99 ≤
50 ms under ingest.

Run from the repo root: ``python benchmarks/soak.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import httpx  # noqa: E402
import msgpack  # noqa: E402
import numpy as np  # noqa: E402
from ingest_http import (  # noqa: E402
    SEQ_BASE,
    SLO_YAML,
    free_port,
    goodput,
    start_server,
    wire_batches,
    workload,
)

INGEST_THREADS = 2
ADMIN_PER_S = 10


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def ingest(
    url: str, key: str, batches: list[Any], stop: threading.Event, rate: float, out: dict[str, int]
) -> None:
    """Send batches paced to ``rate`` tokens/s (this thread's share)."""
    headers = {
        "Authorization": f"Bearer {key}",
        "Content-Type": "application/vnd.goodput.batch+msgpack",
    }
    started = time.perf_counter()
    sent_tokens = 0
    with httpx.Client(headers=headers, timeout=60) as http:
        while not stop.is_set():
            with lock:
                n = out["next"]
                out["next"] = n + 1
            body, pos, _records, tokens = batches[n % len(batches)]
            patched = body[:pos] + (SEQ_BASE + n).to_bytes(8, "big") + body[pos + 8 :]
            envelope = {"v": 1, "crc32": zlib.crc32(patched), "body": patched}
            response = http.post(url, content=msgpack.packb(envelope, use_bin_type=True))
            with lock:
                if response.status_code == 200:
                    out["records"] += response.json()["num_records"]
                    out["tokens"] += tokens
                else:
                    out["errors"] += 1
            sent_tokens += tokens
            ahead_s = sent_tokens / rate - (time.perf_counter() - started)
            if ahead_s > 0:
                stop.wait(ahead_s)


def admin(
    url: str, key: str, stop: threading.Event, latencies: list[float], out: dict[str, int]
) -> None:
    paths = ["/api/v1/slos", "/api/v1/slos/chat/goodput?window=5m", "/api/v1/goodput"]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        k = 0
        while not stop.is_set():
            started = time.perf_counter()
            response = http.get(paths[k % len(paths)])
            latencies.append(time.perf_counter() - started)
            if response.status_code != 200:
                with lock:
                    out["errors"] += 1
            k += 1
            stop.wait(max(0.0, 1 / ADMIN_PER_S - (time.perf_counter() - started)))


lock = threading.Lock()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 s instead of 600 s")
    parser.add_argument("--duration-s", type=float, default=None)
    parser.add_argument("--tokens-per-s", type=float, default=1.2e6)
    args = parser.parse_args()
    duration_s = args.duration_s or (60.0 if args.quick else 600.0)
    warmup_s = max(10.0, duration_s / 10)
    with tempfile.TemporaryDirectory(prefix="goodput-soak-") as tmp:
        folder = Path(tmp)
        w = workload(20_000, time.time())
        batches = wire_batches(w)  # (body, offset of its seq, records, tokens)
        env = {
            **os.environ,
            "GOODPUT_DATABASE_URL": f"sqlite:///{folder / 'goodput.db'}",
            "GOODPUT_LOG_LEVEL": "WARNING",
        }
        goodput(env, "db", "upgrade")
        ingest_key = goodput(env, "admin", "create-key", "--role", "ingest", "--name", "soak")
        viewer_key = goodput(env, "admin", "create-key", "--role", "viewer", "--name", "reader")
        (folder / "slos.yaml").write_text(SLO_YAML)
        goodput(env, "slo", "apply", "-f", str(folder / "slos.yaml"))
        port = free_port()
        server = start_server(env, port)
        url = f"http://127.0.0.1:{port}"
        out = {"records": 0, "tokens": 0, "errors": 0, "next": 0}
        latencies: list[float] = []
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=ingest,
                args=(
                    f"{url}/api/v1/ingest",
                    ingest_key,
                    batches,
                    stop,
                    args.tokens_per_s / INGEST_THREADS,
                    out,
                ),
            )
            for _ in range(INGEST_THREADS)
        ]
        threads.append(threading.Thread(target=admin, args=(url, viewer_key, stop, latencies, out)))
        try:
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            time.sleep(warmup_s)
            rss_start = rss_mb(server.pid)
            warm_latencies = len(latencies)
            time.sleep(max(0.0, duration_s - warmup_s))
            rss_end = rss_mb(server.pid)
            stop.set()
            for thread in threads:
                thread.join(120)
            elapsed_s = time.perf_counter() - started
            with httpx.Client(headers={"Authorization": f"Bearer {viewer_key}"}) as http:
                counted = http.get(f"{url}/api/v1/slos/everything/goodput?window=1h").json()
        finally:
            server.terminate()
            server.wait(30)
    under_load = np.array(latencies[warm_latencies:] or latencies) * 1e3
    counted_records = counted["requests"] + counted["aborted"]
    print(
        json.dumps(
            {
                "records": out["records"],
                "lost": out["records"] - counted_records,
                "rss_mb_start": round(rss_start, 1),
                "rss_mb_end": round(rss_end, 1),
                "rss_growth_ratio": round(rss_end / rss_start - 1, 3),
                "p99_admin_ms": round(float(np.percentile(under_load, 99)), 1),
                "p50_admin_ms": round(float(np.percentile(under_load, 50)), 1),
                "errors": out["errors"],
                "tokens_per_s": round(out["tokens"] / elapsed_s),
                "duration_s": round(elapsed_s, 1),
                "quick": args.quick,
            }
        )
    )


if __name__ == "__main__":
    main()
