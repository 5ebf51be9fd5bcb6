"""Soak: sustained ingest plus admin reads against one control plane, for leaks and loss.

Starts the control plane as a user does (``benchmarks/ingest_http.py``'s server: uvicorn,
SQLite in a temporary folder, durable ingest on, three SLOs), then for ``--duration-s``
(600 s; ``--quick``: 60 s):

* ingest threads send binary wire batches of 512 Azure-conversation requests (one token per
  emission) paced to ``--tokens-per-s`` token timestamps per second (1.2 M), each batch
  under a fresh ``seq``;
* one admin thread reads ``GET /api/v1/slos``, an SLO's goodput and the goodput summary,
  ten times a second, timing each;
* every ``--sample-s`` (10 s) the server's RSS (``VmRSS``, and its anonymous part, from
  ``/proc``) is sampled together with what the server says of its bounded stores on
  ``/metrics``: ``goodput_engine_dry_run_evicted_total`` (rows the dry-run store evicted at
  its cap), ``goodput_engine_records_total{outcome="final"}`` and ``goodput_wal_segments``.
  One line per sample is printed as it is taken.

**Warm-up** ends at the first sample where the dry-run store has evicted a row, i.e. holds
its cap (``dry_run_max_rows``, 1 M rows ≈ 97 MB by default): it is by far the largest
bounded store and the last to fill (at the default rate ~3 min). The other bounded stores
are full long before: the workload's finish times span a fixed 10 minutes, so every ring
slot the records can reach is touched within the first pass over the 20 k requests
(~4 s); de-duplication tracks one exporter; the write-ahead log is on disk, its segments
released at each checkpoint (every minute). ``dry_run_rows`` in the timeline is final
records − evicted rows (nothing expires: every record finishes within the store's hour).

Afterwards ``lost`` = records the server acknowledged − records the engine counts (SLO
``everything``, window 1 h). The last line is one JSON object: ``{"records", "lost",
"rss_mb_start", "rss_mb_end", "rss_growth_ratio", "p99_admin_ms", "errors", ...}`` where
``rss_mb_start`` is the RSS at the end of the warm-up (``warm_s``; ``null`` when the store
never reached its cap, as in a ``--quick`` run at the default cap) and
``rss_growth_ratio`` = ``rss_mb_end`` / ``rss_mb_start`` − 1; ``rss_slope_mb_per_min`` is
a least-squares fit of RSS over the samples after warm-up. For comparison with earlier runs,
``rss_growth_ratio_fixed_warmup`` measures from a fixed tenth of the run (at least 10 s),
what this benchmark reported before. Goals (issue 15): ``lost`` 0, ``errors`` 0, RSS growth
≤ 10 % after warm-up, admin p99 ≤ 50 ms under ingest (after the fixed warm-up).

glibc's mmap threshold (docs/goodput-engine.md, *Soak*): ``--mmap-threshold startup`` (the
default) runs the server as ``goodput controlplane serve`` runs anywhere, fixing the threshold
itself at start-up (``controlplane/allocator.py``; an inherited ``MALLOC_MMAP_THRESHOLD_`` is
removed from its environment so that it is the start-up code that does it); ``glibc`` turns
that off (``GOODPUT_MALLOC_MMAP_THRESHOLD=0``: glibc's dynamic threshold, for comparison);
``environment`` sets ``MALLOC_MMAP_THRESHOLD_=131072`` as an operator may (the
start-up code then leaves it); a number of bytes has the start-up code fix that threshold
instead of the setting's default (``GOODPUT_MALLOC_MMAP_THRESHOLD``).
``--malloc-trim-interval-s S`` sets how often the server calls ``malloc_trim``
(``GOODPUT_MALLOC_TRIM_INTERVAL_S``; 0: never; default: the setting's). The JSON names both.

Diagnostics (never for the reported figure): ``--trace-memory`` starts the server under
``tracemalloc`` (one frame), adds the traced Python/numpy bytes to the timeline and prints
the allocation sites that grew between the end of the warm-up and the end of the run;
``--dry-run-max-rows`` passes another cap to the server (reported in the JSON), so that a
short run gets past the warm-up.

Run from the repo root: ``python benchmarks/soak.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
EVICTED = "goodput_engine_dry_run_evicted_total"
FINAL = 'goodput_engine_records_total{outcome="final"}'
WAL_SEGMENTS = "goodput_wal_segments"
# --mmap-threshold: what the server's environment gets (after both variables are removed).
MMAP_MODES: dict[str, dict[str, str]] = {
    "startup": {},
    "glibc": {"GOODPUT_MALLOC_MMAP_THRESHOLD": "0"},
    "environment": {"MALLOC_MMAP_THRESHOLD_": "131072"},
}

# Runs the ``goodput`` module under tracemalloc: the traced bytes go to ``traced`` every
# second; SIGUSR1 dumps a snapshot ``snapshot-<n>.tm`` (``--trace-memory``).
TRACER = """
import os, runpy, signal, sys, threading, time, tracemalloc
tracemalloc.start(1)
folder = os.environ["SOAK_TRACE_DIR"]
dumps = [0]
def dump(signum, frame):
    dumps[0] += 1
    tracemalloc.take_snapshot().dump(os.path.join(folder, f"snapshot-{dumps[0]}.tm"))
signal.signal(signal.SIGUSR1, dump)
def report():
    while True:
        with open(os.path.join(folder, "traced.tmp"), "w") as f:
            f.write(str(tracemalloc.get_traced_memory()[0]))
        os.replace(os.path.join(folder, "traced.tmp"), os.path.join(folder, "traced"))
        time.sleep(1)
threading.Thread(target=report, daemon=True).start()
sys.argv = sys.argv[1:]
runpy.run_module("goodput", run_name="__main__", alter_sys=True)
"""


def mmap_mode(value: str) -> str:
    """``--mmap-threshold``: one of :data:`MMAP_MODES` or a positive number of bytes."""
    if value in MMAP_MODES or (value.isdigit() and int(value) > 0):
        return value
    raise argparse.ArgumentTypeError(f"one of {', '.join(MMAP_MODES)} or a number of bytes")


def rss_mb(pid: int) -> tuple[float, float]:
    """(RSS, its anonymous part) of ``pid`` in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0]) / 1024
    return fields["Rss"], fields["Anonymous"]


def scrape(http: httpx.Client, url: str) -> dict[str, float]:
    """``/metrics`` as ``{series with its labels: value}``."""
    values: dict[str, float] = {}
    for line in http.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            values[series] = float(value)
    return values


def sample(
    http: httpx.Client, url: str, pid: int, t_s: float, trace_dir: Path | None
) -> dict[str, Any]:
    """One timeline row (printed as it is taken)."""
    rss, anon = rss_mb(pid)
    metrics = scrape(http, url)
    evicted = int(metrics.get(EVICTED, 0))
    row: dict[str, Any] = {
        "t_s": round(t_s, 1),
        "rss_mb": round(rss, 1),
        "anon_mb": round(anon, 1),
        "dry_run_rows": int(metrics.get(FINAL, 0)) - evicted,
        "evicted": evicted,
        "wal_segments": int(metrics.get(WAL_SEGMENTS, 0)),
    }
    if trace_dir is not None and (trace_dir / "traced").exists():
        row["traced_mb"] = round(int((trace_dir / "traced").read_text()) / 2**20, 1)
    print("# " + "  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    return row


def slope_mb_per_min(rows: list[dict[str, Any]]) -> float | None:
    """Least-squares slope of RSS over ``rows``, MB per minute."""
    if len(rows) < 3:
        return None
    t = np.array([r["t_s"] for r in rows]) / 60
    rss = np.array([r["rss_mb"] for r in rows])
    return round(float(np.polyfit(t, rss, 1)[0]), 2)


def snapshot_growth(trace_dir: Path, top: int = 15) -> None:
    """Print the allocation sites that grew most between the two snapshots."""
    import tracemalloc

    first = tracemalloc.Snapshot.load(str(trace_dir / "snapshot-1.tm"))
    last = tracemalloc.Snapshot.load(str(trace_dir / "snapshot-2.tm"))
    print("# tracemalloc growth from the end of the warm-up to the end (top sites):")
    for stat in last.compare_to(first, "lineno")[:top]:
        print(f"#   {stat}")


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
    parser.add_argument("--sample-s", type=float, default=10.0, help="RSS sampling period")
    parser.add_argument(
        "--trace-memory", action="store_true", help="run the server under tracemalloc"
    )
    parser.add_argument(
        "--dry-run-max-rows", type=int, default=None, help="diagnostics: another store cap"
    )
    parser.add_argument(
        "--mmap-threshold",
        type=mmap_mode,
        default="startup",
        help="who fixes glibc's mmap threshold: the control plane at start-up (default), "
        "nobody (glibc's dynamic default), MALLOC_MMAP_THRESHOLD_=131072 set by an operator, "
        "or the control plane at start-up at this many bytes",
    )
    parser.add_argument(
        "--malloc-trim-interval-s",
        type=float,
        default=None,
        help="seconds between the server's malloc_trim calls (0: never; default: the setting's)",
    )
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
        for name in (
            "MALLOC_MMAP_THRESHOLD_",
            "GOODPUT_MALLOC_MMAP_THRESHOLD",
            "GOODPUT_MALLOC_TRIM_INTERVAL_S",
        ):
            env.pop(name, None)
        fixed_at = {"GOODPUT_MALLOC_MMAP_THRESHOLD": args.mmap_threshold}
        env.update(MMAP_MODES.get(args.mmap_threshold, fixed_at))
        if args.malloc_trim_interval_s is not None:
            env["GOODPUT_MALLOC_TRIM_INTERVAL_S"] = str(args.malloc_trim_interval_s)
        if args.dry_run_max_rows is not None:
            env["GOODPUT_DRY_RUN_MAX_ROWS"] = str(args.dry_run_max_rows)
        launcher = None
        trace_dir = None
        if args.trace_memory:
            trace_dir = folder / "trace"
            trace_dir.mkdir()
            env["SOAK_TRACE_DIR"] = str(trace_dir)
            launcher = [sys.executable, "-c", TRACER]
        goodput(env, "db", "upgrade")
        ingest_key = goodput(env, "admin", "create-key", "--role", "ingest", "--name", "soak")
        viewer_key = goodput(env, "admin", "create-key", "--role", "viewer", "--name", "reader")
        (folder / "slos.yaml").write_text(SLO_YAML)
        goodput(env, "slo", "apply", "-f", str(folder / "slos.yaml"))
        port = free_port()
        server = start_server(env, port, launcher)
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
        samples: list[dict[str, Any]] = []
        warm: dict[str, Any] | None = None  # the first sample with the dry-run store full
        fixed: dict[str, Any] | None = None  # the first sample after the fixed warm-up
        warm_latencies = 0
        try:
            with httpx.Client() as http:
                samples.append(sample(http, url, server.pid, 0.0, trace_dir))
                started = time.perf_counter()
                for thread in threads:
                    thread.start()
                k = 1
                while (elapsed_s := time.perf_counter() - started) < duration_s:
                    next_s = min(k * args.sample_s, duration_s)
                    if fixed is None:
                        next_s = min(next_s, warmup_s)
                    time.sleep(max(0.0, next_s - elapsed_s))
                    row = sample(http, url, server.pid, time.perf_counter() - started, trace_dir)
                    samples.append(row)
                    if fixed is None and row["t_s"] >= warmup_s:
                        fixed, warm_latencies = row, len(latencies)
                    if warm is None and row["evicted"] > 0:
                        warm = row
                        if trace_dir is not None:
                            server.send_signal(signal.SIGUSR1)
                    if next_s >= k * args.sample_s:
                        k += 1
                end = samples[-1]
                if trace_dir is not None and warm is not None:
                    server.send_signal(signal.SIGUSR1)
                    time.sleep(5)  # let the dump finish before the load stops
                stop.set()
                for thread in threads:
                    thread.join(120)
                elapsed_s = time.perf_counter() - started
                counted = http.get(
                    f"{url}/api/v1/slos/everything/goodput?window=1h",
                    headers={"Authorization": f"Bearer {viewer_key}"},
                ).json()
        finally:
            server.terminate()
            server.wait(30)
        if trace_dir is not None and (trace_dir / "snapshot-2.tm").exists():
            snapshot_growth(trace_dir)
    assert fixed is not None
    under_load = np.array(latencies[warm_latencies:] or latencies) * 1e3
    counted_records = counted["requests"] + counted["aborted"]
    after_warm = [r for r in samples if warm is not None and r["t_s"] >= warm["t_s"]]
    print(
        json.dumps(
            {
                "records": out["records"],
                "lost": out["records"] - counted_records,
                "rss_mb_start": warm and warm["rss_mb"],
                "rss_mb_end": end["rss_mb"],
                "rss_growth_ratio": warm and round(end["rss_mb"] / warm["rss_mb"] - 1, 3),
                "warm_s": warm and warm["t_s"],
                "rss_mb_max_after_warm": max((r["rss_mb"] for r in after_warm), default=None),
                "rss_slope_mb_per_min": slope_mb_per_min(after_warm),
                "rss_mb_fixed_warmup": fixed["rss_mb"],
                "rss_growth_ratio_fixed_warmup": round(end["rss_mb"] / fixed["rss_mb"] - 1, 3),
                "p99_admin_ms": round(float(np.percentile(under_load, 99)), 1),
                "p50_admin_ms": round(float(np.percentile(under_load, 50)), 1),
                "errors": out["errors"],
                "tokens_per_s": round(out["tokens"] / elapsed_s),
                "duration_s": round(elapsed_s, 1),
                "dry_run_max_rows": args.dry_run_max_rows,
                "trace_memory": args.trace_memory,
                "mmap_threshold": args.mmap_threshold,
                "malloc_trim_interval_s": args.malloc_trim_interval_s,
                "quick": args.quick,
            }
        )
    )


if __name__ == "__main__":
    main()
