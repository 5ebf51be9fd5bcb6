"""A stalled control plane (it accepts connections and never answers): the exporter's
``export`` stays an append (serving is unaffected), its bounded buffer drops the oldest
batches and counts them, and ``shutdown`` returns within its timeout."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from exporters.recorder import RequestRecorder
from exporters.records import Labels, Vantage
from exporters.transport import ControlPlaneExporter

pytestmark = pytest.mark.faults


def test_a_stalled_control_plane_costs_serving_nothing() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept_and_stall() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)  # read nothing, answer nothing

    threading.Thread(target=accept_and_stall, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    exporter = ControlPlaneExporter(
        url, api_key="gp_x", flush_interval_s=0.01, max_batch_records=64, timeout_s=0.5,
        max_buffer_bytes=64 * 1024, backoff_initial_s=0.05, backoff_max_s=0.2,
        registry=CollectorRegistry(),
    )  # fmt: skip
    recorder = RequestRecorder(Vantage.GATEWAY, exporter)
    latencies: list[float] = []
    try:
        for k in range(20_000):
            started = time.perf_counter()
            trace = recorder.start(f"r{k}", Labels(model="llama"))
            trace.token()
            trace.finish()
            latencies.append(time.perf_counter() - started)
        time.sleep(1.0)
        stats = exporter.stats()
        assert stats.num_exported_records == 0
        assert stats.num_dropped_records > 0  # the bounded buffer dropped and counted
        assert stats.buffer_bytes <= 64 * 1024
        assert stats.num_retries > 0
        # Export never waits for the network: an append under a lock (a busy machine may
        # still deschedule a call now and then; the 99th percentile shows the design).
        assert sorted(latencies)[int(0.99 * len(latencies))] < 0.005
    finally:
        started = time.perf_counter()
        exporter.shutdown(timeout_s=1.0)
        assert time.perf_counter() - started < 3.0
        listener.close()
        for conn in held:
            conn.close()
    final = exporter.stats()
    # Every record is accounted for: nothing exported, the rest dropped (counted).
    assert final.num_dropped_records + final.num_rejected_records == 20_000
    assert final.num_pending_records == final.num_buffered_batches == 0
