"""Benchmark: control-plane replicas sharing ingest through the fleet log (PostgreSQL).

Three kinds of phase on the same pre-encoded wire batches as ``ingest_http.py`` (Azure
conversation shapes, 512 records a batch), each on a fresh PostgreSQL schema, each
control plane started the way a user does (``goodput controlplane serve``):

1. **single**: one replica counting what it receives (the local write-ahead log, fsync'd);
2. **fleet of one**: one replica with ``GOODPUT_FLEET_INGEST`` (each batch committed to the
   fleet log before its 200, then read back and counted): the cost of the cross-replica
   path against phase 1;
3. **fleet of three**: three replicas, the senders spread across them.

Phases 1 and 2 run in ``--rounds`` pairs (3), back to back, alternating which goes first
(single first in rounds 1 and 3): ``cross_replica_ratio`` is the median of the pairs'
ratios, so a change in the machine's load (it is shared) moves both sides of a pair
rather than the ratio, and one disturbed pair does not decide it. ``single_tokens_per_s``
and ``fleet_one_tokens_per_s`` are the medians of their phases.

Throughput is what every replica has *counted*, not what was acknowledged: a phase ends
when the slowest replica's ``goodput_ingest_tokens_total`` reaches the tokens
acknowledged, and tokens/s divides by that time. Then, on the three replicas: query
latency (``GET /api/v1/slos/chat/goodput``, sequential, round robin over the replicas;
each client's keep-alive connection is opened by one ``GET /health`` first, not timed:
a dashboard pays its connection once, not per query), and failover (``kill -9`` of the
leader until another reports ``goodput_leader 1``).

Run from the repo root: ``python benchmarks/scale_out.py [--quick] [--rounds N]`` (PostgreSQL on
127.0.0.1:5432, database ``test``). The last line is one JSON object: ``replicas``,
``tokens_per_s`` (fleet of three), ``single_tokens_per_s`` (phase 1),
``fleet_one_tokens_per_s`` (phase 2), ``scaling_ratio`` = three ÷ single,
``cross_replica_ratio`` = the pairs' median of fleet of one ÷ single,
``log_bytes_per_token``, ``failover_s``, ``query_p50_ms``, ``query_p99_ms``. The line
before it holds the phases, each pair's ``cross_replica_ratios`` and a breakdown of the
queries: ``query_first_ms`` (each replica's first goodput query: the route's first
request in that process), ``query_p99_after_first_ms`` (the others) and
``query_slowest_ms``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import httpx  # noqa: E402
import psycopg  # noqa: E402
from ingest_http import (  # noqa: E402
    BATCH_RECORDS,
    SLO_YAML,
    free_port,
    goodput,
    run_client,
    start_server,
    wire_batches,
    workload,
)

PG = "postgresql://postgres@127.0.0.1:5432/test"


def create_schema() -> str:
    schema = f"gp_bench_{secrets.token_hex(4)}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return schema


def drop_schema(schema: str) -> None:
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def log_bytes(schema: str) -> int:
    with psycopg.connect(PG, autocommit=True) as conn:
        row = conn.execute(
            f'SELECT coalesce(sum(length(entry)), 0) FROM "{schema}".goodput_fleet_log'
        ).fetchone()
    return int(row[0]) if row else 0


def metric(url: str, name: str, **labels: str) -> float:
    from serving.workers.load import metric_sum

    return metric_sum(httpx.get(f"{url}/metrics", timeout=10).text, name, **labels)


class Phase:
    """``n`` replicas on a fresh schema; senders spread across them."""

    def __init__(self, folder: Path, n: int, fleet: bool) -> None:
        self.schema = create_schema()
        self.folder = folder
        self.env = {
            **os.environ,
            "GOODPUT_DATABASE_URL": f"{PG}?options=-csearch_path%3D{self.schema}",
            "GOODPUT_LOG_LEVEL": "WARNING",
            "GOODPUT_PLANNER_ENABLED": "false",
            "GOODPUT_ADMISSION_ENABLED": "false",
            "GOODPUT_WAL_DIR": str(folder / f"wal-{self.schema}"),
            "GOODPUT_FLEET_INGEST": "true" if fleet else "false",
            "GOODPUT_ROLLUP_INTERVAL_S": "3600",  # the log keeps every row to be measured
        }
        goodput(self.env, "db", "upgrade")
        self.key = goodput(self.env, "admin", "create-key", "--role", "admin", "--name", "b")
        (folder / "slos.yaml").write_text(SLO_YAML)
        goodput(self.env, "slo", "apply", "-f", str(folder / "slos.yaml"))
        self.ports = [free_port() for _ in range(n)]
        self.servers = [
            start_server({**self.env, "GOODPUT_REPLICA_ID": f"cp-{i}"}, port)
            for i, port in enumerate(self.ports)
        ]

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def ingest(self, duration_s: float, connections: int) -> dict[str, Any]:
        """Send for ``duration_s`` (connections spread over the replicas); wait until
        every replica counted every acknowledged token."""
        results: list[dict[str, Any]] = []
        per = max(1, connections // len(self.urls))

        def send(k: int, url: str) -> None:
            # Each sender an exporter of its own: copies of one exporter's batches are
            # counted once by the fleet, as they must be.
            folder = self.folder / f"sender-{k}"
            spec = {"key": self.key, "folder": str(folder), "duration_s": duration_s,
                    "connections": per, "url": url, "kind": "wire"}  # fmt: skip
            results.append(run_client(spec, folder))

        started = time.perf_counter()
        threads = [threading.Thread(target=send, args=kv) for kv in enumerate(self.urls)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        sent_s = time.perf_counter() - started
        tokens = sum(r["tokens"] for r in results)
        deadline = time.monotonic() + 600
        for url in self.urls:
            while metric(url, "goodput_ingest_tokens_total", protocol="wire") < tokens:
                assert time.monotonic() < deadline, f"{url} did not count {tokens} tokens"
                time.sleep(0.05)
        counted_s = time.perf_counter() - started
        return {
            "tokens": tokens,
            "records": sum(r["records"] for r in results),
            "errors": sum(r["errors"] for r in results),
            "sent_s": round(sent_s, 2),
            "counted_s": round(counted_s, 2),
            "tokens_per_s": tokens / counted_s,
            "log_bytes": log_bytes(self.schema),
        }

    def query_latencies_ms(self, count: int) -> list[float]:
        headers = {"Authorization": f"Bearer {self.key}"}
        clients = [httpx.Client(base_url=u, headers=headers, timeout=10) for u in self.urls]
        out = []
        try:
            for client in clients:  # the connection, opened before the clock starts
                client.get("/health").raise_for_status()
            for k in range(count):
                client = clients[k % len(clients)]
                started = time.perf_counter()
                client.get("/api/v1/slos/chat/goodput", params={"window": "5m"}).raise_for_status()
                out.append((time.perf_counter() - started) * 1000)
        finally:
            for client in clients:
                client.close()
        return out

    def failover_s(self) -> float:
        leaders = [i for i, url in enumerate(self.urls) if metric(url, "goodput_leader") == 1]
        assert len(leaders) == 1, leaders
        self.servers[leaders[0]].kill()
        self.servers[leaders[0]].wait(10)
        started = time.perf_counter()
        others = [u for i, u in enumerate(self.urls) if i != leaders[0]]
        while not any(metric(u, "goodput_leader") == 1 for u in others):
            assert time.perf_counter() - started < 60, "no new leader"
            time.sleep(0.05)
        return time.perf_counter() - started

    def stop(self) -> None:
        for server in self.servers:
            if server.poll() is None:
                server.terminate()
                server.wait(30)
        drop_schema(self.schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases, less data")
    parser.add_argument(
        "--rounds", type=int, default=3, help="pairs of single and fleet-of-one phases"
    )
    args = parser.parse_args()
    duration_s, num_requests, queries = (3.0, 8 * BATCH_RECORDS, 300) if args.quick else (
        10.0, 19_000, 1000)  # fmt: skip
    connections = 3
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="goodput-scale-") as tmp:
        folder = Path(tmp)
        batches = wire_batches(workload(num_requests, time.time()))
        for sender in range(3):  # the exporter id "bench" becomes "bnch0" … "bnch2"
            sub = folder / f"sender-{sender}"
            sub.mkdir()
            (sub / "wire.json").write_text(json.dumps([[p, r, t] for _, p, r, t in batches]))
            for k, (body, *_rest) in enumerate(batches):
                assert body.count(b"\xa5bench") == 1
                patched = body.replace(b"\xa5bench", b"\xa5bnch" + str(sender).encode())
                (sub / f"wire-{k}.bin").write_bytes(patched)
        pairs: list[dict[str, dict[str, Any]]] = []
        for round_ in range(args.rounds):
            order = [("single", False), ("fleet_one", True)]
            pair: dict[str, dict[str, Any]] = {}
            for name, fleet in order if round_ % 2 == 0 else order[::-1]:
                phase = Phase(folder, 1, fleet)
                try:
                    pair[name] = phase.ingest(duration_s, connections)
                finally:
                    phase.stop()
            pairs.append(pair)
        phase = Phase(folder, 3, True)
        try:
            fleet_three = phase.ingest(duration_s, connections)
            latencies = phase.query_latencies_ms(queries)
            failover = phase.failover_s()
        finally:
            phase.stop()
    phases = {"pairs": pairs, "fleet_three": fleet_three}
    single = statistics.median(p["single"]["tokens_per_s"] for p in pairs)
    one = statistics.median(p["fleet_one"]["tokens_per_s"] for p in pairs)
    ratios = [p["fleet_one"]["tokens_per_s"] / p["single"]["tokens_per_s"] for p in pairs]
    three = fleet_three["tokens_per_s"]
    quantiles = statistics.quantiles(latencies, n=100)
    # The breakdown: each replica's first goodput query (the route's first request in its
    # process); the rest is the steady state.
    warm = statistics.quantiles(latencies[3:], n=100)
    print(json.dumps({"phases": phases, "connections": connections,
                      "query_first_ms": [round(x, 2) for x in latencies[:3]],
                      "query_p99_after_first_ms": round(warm[98], 2),
                      "query_slowest_ms": [round(x, 2) for x in sorted(latencies)[-5:]],
                      "cross_replica_ratios": [round(r, 3) for r in ratios],
                      "load_before": load_before, "load_after": os.getloadavg()[0]}))  # fmt: skip
    print(
        json.dumps(
            {
                "replicas": 3,
                "tokens_per_s": round(three),
                "single_tokens_per_s": round(single),
                "fleet_one_tokens_per_s": round(one),
                "scaling_ratio": round(three / single, 3),
                "cross_replica_ratio": round(statistics.median(ratios), 3),
                "log_bytes_per_token": round(
                    fleet_three["log_bytes"] / max(fleet_three["tokens"], 1), 3
                ),
                "failover_s": round(failover, 2),
                "query_p50_ms": round(quantiles[49], 2),
                "query_p99_ms": round(quantiles[98], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
