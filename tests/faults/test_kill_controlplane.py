"""``kill -9`` of the control plane during ingest: every acknowledged record survives, and
nothing is counted twice (the exporter resends what was not acknowledged; the write-ahead
log gives back what was, with its de-duplication state)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.recorder import RequestRecorder
from exporters.records import Labels, Vantage
from exporters.transport import ControlPlaneExporter
from tests.faults.conftest import ControlPlane

pytestmark = pytest.mark.faults


def stream(exporter: ControlPlaneExporter, stop: threading.Event, sent: list[int]) -> None:
    """Requests of three tokens each, as fast as a recorder makes them."""
    recorder = RequestRecorder(Vantage.GATEWAY, exporter)
    k = 0
    while not stop.is_set():
        for _ in range(50):
            trace = recorder.start(f"r{k}", Labels(model="llama"))
            trace.token()
            trace.tokens(2)
            trace.finish()
            k += 1
        sent[0] = k
        time.sleep(0.005)


def test_kill_9_during_a_stream_loses_no_acknowledged_record(
    control_plane: ControlPlane,
) -> None:
    plane = control_plane.prepare(rollup_interval_s="2").start()
    served = httpx.get(f"{plane.url}/health", timeout=5)
    assert "server" not in served.headers  # `goodput controlplane serve`: no Server header
    exporter = ControlPlaneExporter(
        plane.url, api_key=plane.keys["ingest"], flush_interval_s=0.02, backoff_initial_s=0.05,
        backoff_max_s=0.5, max_buffer_bytes=256 * 1024 * 1024, registry=CollectorRegistry(),
    )  # fmt: skip
    stop, sent = threading.Event(), [0]
    producer = threading.Thread(target=stream, args=(exporter, stop, sent), daemon=True)
    producer.start()
    try:
        time.sleep(3.0)  # a rollup and its checkpoint have happened; more is in the log
        acknowledged_before = exporter.stats().num_exported_records
        plane.kill()
        time.sleep(1.0)  # the exporter buffers and retries meanwhile
        plane.start()
        time.sleep(2.0)
    finally:
        stop.set()
        producer.join(10)
    assert exporter.force_flush(60.0)
    exporter.shutdown(10.0)
    stats = exporter.stats()
    assert acknowledged_before > 0
    assert stats.num_dropped_records == stats.num_rejected_records == 0, stats
    assert stats.num_exported_records == sent[0], stats
    # 0 lost, 0 counted twice: the engine counts exactly the acknowledged records.
    assert plane.requests_counted() == sent[0]
