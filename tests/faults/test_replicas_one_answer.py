"""Three control-plane replicas sharing ingest through the fleet log (PostgreSQL) answer
as one: with three exporters each sending to a different replica, every replica reports,
for every SLO, the counts, attainment, burn rate, error budget and percentiles that one
replica reports for the same records, exactly. ``kill -9`` of one replica loses none of
the records it acknowledged: the others count them, and it counts them again when it
comes back (docs/scale-out.md, "N replicas, one answer").
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.recorder import RequestRecorder
from exporters.records import Labels, RequestRecord, Status, Vantage
from exporters.transport import ControlPlaneExporter
from serving.workers.load import metric_sum
from tests.faults.conftest import ControlPlane
from tests.integration.controlplane.conftest import create_schema, drop_schema, schema_url

pytestmark = pytest.mark.faults

SLOS_YAML = """\
name: fast
selector: {model: llama}
objectives:
  - {metric: ttft, threshold_s: 0.5}
target: 0.9
window_s: 3600
---
name: whole
selector: {model: llama}
objectives:
  - {metric: ttft, threshold_s: 1.0}
  - {metric: e2el, threshold_s: 3.0}
  - {metric: itl, threshold_s: 0.08, statistic: p99}
target: 0.95
window_s: 86400
"""
COMPARED = (
    "requests", "good", "bad", "errors", "aborted", "rejected", "output_tokens",
    "good_output_tokens", "attainment_ratio", "burn_rate", "error_budget_remaining_ratio",
    "availability_ratio", "violations", "measured", "ttft", "itl", "e2el", "tpot",
)  # fmt: skip
PER_SOURCE = 400


class Tee:
    """Hands each finished record to several exporters (the same records to the three
    replicas' fleet and to the lone replica)."""

    def __init__(self, *exporters: ControlPlaneExporter) -> None:
        self.exporters = exporters

    def export(self, record: RequestRecord) -> None:
        for exporter in self.exporters:
            exporter.export(record)


def exporter(url: str, key: str) -> ControlPlaneExporter:
    return ControlPlaneExporter(
        url, api_key=key, flush_interval_s=0.05, backoff_initial_s=0.05, backoff_max_s=0.5,
        max_buffer_bytes=64 * 1024 * 1024, registry=CollectorRegistry(),
    )  # fmt: skip


def produce(sink: Tee, seed: int, count: int) -> None:
    """``count`` requests with seeded latencies: TTFT 50 ms to 2 s, 4-40 tokens 5-120 ms
    apart, a few errors, labels the SLOs select."""
    rng = random.Random(seed)
    clock = [time.perf_counter_ns()]
    recorder = RequestRecorder(Vantage.GATEWAY, sink, clock_ns=lambda: clock[0])
    for k in range(count):
        clock[0] += int(rng.uniform(0.001, 0.01) * 1e9)
        trace = recorder.start(f"s{seed}-r{k}", Labels(model="llama"))
        clock[0] += int(rng.uniform(0.05, 2.0) * 1e9)
        trace.token()
        for _ in range(rng.randint(3, 39)):
            clock[0] += int(rng.uniform(0.005, 0.12) * 1e9)
            trace.token()
        trace.finish(Status.ERROR if rng.random() < 0.03 else Status.OK)


def stats(plane: ControlPlane) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    with plane.admin() as http:
        for slo in ("all", "fast", "whole"):
            for window in ("5m", "1h", "compliance"):
                response = http.get(f"/api/v1/slos/{slo}/goodput", params={"window": window})
                response.raise_for_status()
                body = response.json()
                out[(slo, window)] = {k: body[k] for k in COMPARED}
    return out


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def leads(plane: ControlPlane) -> bool:
    text = httpx.get(f"{plane.url}/metrics", timeout=5).text
    return metric_sum(text, "goodput_leader") == 1


@pytest.fixture
def planes(tmp_path: Path) -> Iterator[tuple[list[ControlPlane], ControlPlane]]:
    fleet_schema, lone_schema = create_schema(), create_schema()
    replicas = [ControlPlane(tmp_path / f"cp-{i}") for i in (1, 2, 3)]
    lone = ControlPlane(tmp_path / "lone")
    try:
        for plane in (*replicas, lone):
            plane.folder.mkdir()
        common = {"rollup_interval_s": "2", "wal_dir": str(tmp_path / "lone" / "wal")}
        first = replicas[0].prepare(
            database_url=schema_url(fleet_schema), fleet_ingest="true", replica_id="cp-1",
            **common,
        )  # fmt: skip
        (first.folder / "more.yaml").write_text(SLOS_YAML)
        first.cli("slo", "apply", "-f", str(first.folder / "more.yaml"))
        for i, plane in enumerate(replicas[1:], start=2):
            plane.env = {**first.env, "GOODPUT_REPLICA_ID": f"cp-{i}"}
            plane.keys = first.keys
        lone.prepare(database_url=schema_url(lone_schema), **common)
        lone.cli("slo", "apply", "-f", str(first.folder / "more.yaml"))
        for plane in (*replicas, lone):
            plane.start()
        yield replicas, lone
    finally:
        for plane in (*replicas, lone):
            plane.stop()
        drop_schema(fleet_schema)
        drop_schema(lone_schema)


def test_three_replicas_answer_as_one_and_a_killed_one_loses_nothing(
    planes: tuple[list[ControlPlane], ControlPlane],
) -> None:
    replicas, lone = planes
    sources = [
        (exporter(plane.url, plane.keys["ingest"]), exporter(lone.url, lone.keys["ingest"]))
        for plane in replicas
    ]
    try:
        for seed, (to_replica, to_lone) in enumerate(sources):
            produce(Tee(to_replica, to_lone), seed, PER_SOURCE)
        for pair in sources:
            for sink in pair:
                assert sink.force_flush(60.0)
        total = 3 * PER_SOURCE
        eventually(lambda: all(p.requests_counted() == total for p in (*replicas, lone)),
                   "every replica counting every record")  # fmt: skip
        expected = stats(lone)
        assert 0.1 < (expected[("fast", "1h")]["attainment_ratio"] or 0) < 0.9, expected
        for plane in replicas:
            assert stats(plane) == expected, plane.url

        # kill -9 one replica mid-stream: what it acknowledged is counted by the others
        # now and by itself after its restart, once.
        # The leader: it wrote the rollups and the log's checkpoint, so its restart reads
        # the log from a checkpoint (the rows it covers add only their later records).
        # Rollups are of complete minutes: wait for the minute to end, and a rollup cycle.
        time.sleep(60 - time.time() % 60 + 3)
        leader = next(i for i, p in enumerate(replicas) if leads(p))
        victim = replicas[leader]
        text = httpx.get(f"{victim.url}/metrics", timeout=5).text
        assert metric_sum(text, "goodput_rollup_rows_total", outcome="written") > 0
        followers = [p for p in replicas if p is not victim]
        for plane in followers:  # one writer of rollups: the leader
            text = httpx.get(f"{plane.url}/metrics", timeout=5).text
            assert metric_sum(text, "goodput_rollup_rows_total", outcome="written") == 0
        to_victim, to_lone = sources[leader]
        produce(Tee(to_victim, to_lone), 10, PER_SOURCE)
        assert to_victim.force_flush(60.0)
        victim.kill()
        other = (leader + 1) % 3
        produce(Tee(*sources[other]), 11, PER_SOURCE)
        for sink in (*sources[other], to_lone):
            assert sink.force_flush(60.0)
        total += 2 * PER_SOURCE
        survivors = [p for p in replicas if p is not victim]
        eventually(lambda: all(p.requests_counted() == total for p in (*survivors, lone)),
                   "the survivors counting the killed replica's acknowledged records")  # fmt: skip
        victim.start()
        eventually(lambda: victim.requests_counted() == total, "the restarted replica")
        expected = stats(lone)
        for plane in replicas:
            assert stats(plane) == expected, plane.url
        # The SLO series come from the leader alone (one copy of each for Prometheus).
        exporting = []
        with httpx.Client(timeout=5) as http:
            for plane in replicas:
                text = http.get(f"{plane.url}/metrics").text
                assert "goodput_fleet_log_rows_total" in text
                if metric_sum(text, "goodput_requests_total") > 0:
                    exporting.append(plane)
        assert exporting == [p for p in replicas if leads(p)], exporting
    finally:
        for pair in sources:
            for sink in pair:
                sink.shutdown(10.0)
