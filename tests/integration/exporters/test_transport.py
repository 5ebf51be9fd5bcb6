"""ControlPlaneExporter against a real HTTP endpoint on loopback: outages and a full buffer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from prometheus_client import CollectorRegistry

from exporters.recorder import RequestRecorder
from exporters.records import Labels, RecordBatch, Vantage
from exporters.sinks import InMemorySink
from exporters.transport import ControlPlaneExporter
from exporters.wire import encode_batch
from tests.integration.exporters.conftest import LOST_ACK

if TYPE_CHECKING:
    from tests.integration.exporters.conftest import IngestServer, Receiver, WaitUntil

pytestmark = pytest.mark.integration


def record_requests(recorder: RequestRecorder, ids: range) -> None:
    for i in ids:
        trace = recorder.start(f"r{i:04d}", Labels(model="llama"))
        trace.token()
        trace.tokens(3)
        trace.finish()


def fast_exporter(url: str, **kwargs: object) -> ControlPlaneExporter:
    settings: dict[str, object] = {
        "flush_interval_s": 0.02,
        "max_batch_records": 20,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "timeout_s": 2.0,
    }
    settings.update(kwargs)
    return ControlPlaneExporter(url, **settings)  # type: ignore[arg-type]


def test_a_lone_record_leaves_within_the_flush_interval_without_a_flush(
    server: IngestServer, receiver: Receiver, wait_until: WaitUntil
) -> None:
    # An idle worker sleeps without a timer: the first record must wake it, or a quiet
    # producer's records would wait for a full batch (or for shutdown).
    exporter = fast_exporter(server.url, flush_interval_s=0.05, max_batch_records=512)
    recorder = RequestRecorder(Vantage.GATEWAY, exporter)
    try:
        wait_until(lambda: exporter.stats().num_pending_records == 0)  # worker idle
        record_requests(recorder, range(1))
        wait_until(lambda: receiver.count() == 1)
        record_requests(recorder, range(1, 2))  # and again after it went idle
        wait_until(lambda: receiver.count() == 2)
    finally:
        exporter.shutdown(2.0)
    assert receiver.request_ids() == ["r0000", "r0001"]


def test_every_record_arrives_exactly_once_across_an_outage(
    server: IngestServer, receiver: Receiver, wait_until: WaitUntil
) -> None:
    exporter = fast_exporter(server.url)
    recorder = RequestRecorder(Vantage.GATEWAY, exporter)
    try:
        record_requests(recorder, range(100))
        wait_until(lambda: receiver.count() >= 20)

        server.stop()
        record_requests(recorder, range(100, 200))  # recording goes on while it is down
        wait_until(lambda: exporter.stats().num_retries >= 3)
        assert exporter.stats().num_buffered_batches > 0

        server.start()  # same port
        with receiver.lock:  # the first delivery after the restart loses its acknowledgement
            receiver.script.append(LOST_ACK)
        record_requests(recorder, range(200, 300))
        assert exporter.force_flush(5.0) is True
    finally:
        exporter.shutdown(2.0)

    ids = receiver.request_ids()
    assert sorted(ids) == [f"r{i:04d}" for i in range(300)]  # each exactly once
    assert receiver.num_duplicates >= 1  # the resent batch was dropped by seq
    assert sorted(receiver.seqs) == list(range(len(receiver.seqs)))  # no seq skipped
    stats = exporter.stats()
    assert stats.num_exported_records == 300
    assert (stats.num_dropped_records, stats.num_rejected_records) == (0, 0)
    assert stats.num_retries >= 4
    assert (stats.num_buffered_batches, stats.buffer_bytes, stats.num_pending_records) == (0, 0, 0)


def test_a_full_buffer_drops_the_oldest_batches_and_counts_exactly_what_is_missing(
    server: IngestServer, receiver: Receiver, wait_until: WaitUntil
) -> None:
    server.stop()  # the control plane is down from the start
    sample = InMemorySink()  # the size of one full batch, to size the buffer to four
    record_requests(RequestRecorder(Vantage.GATEWAY, sample), range(10))
    batch = RecordBatch.from_records(sample.records)
    batch_bytes = len(encode_batch(batch, exporter_id="x" * 32, seq=0))
    registry = CollectorRegistry()
    exporter = fast_exporter(
        server.url,
        max_batch_records=10,
        max_buffer_bytes=4 * batch_bytes,
        registry=registry,
    )
    recorder = RequestRecorder(Vantage.GATEWAY, exporter)
    try:
        record_requests(recorder, range(200))
        wait_until(
            lambda: (
                exporter.stats().num_pending_records == 0
                and exporter.stats().num_dropped_records > 100
            )
        )
        server.start()
        assert exporter.force_flush(5.0) is True
    finally:
        exporter.shutdown(2.0)

    received = sorted(receiver.request_ids())
    missing = sorted(set(f"r{i:04d}" for i in range(200)) - set(received))
    stats = exporter.stats()
    assert len(received) == len(set(received))
    assert stats.num_dropped_records == len(missing) > 0
    assert stats.num_exported_records == len(received) == 200 - len(missing)
    assert stats.num_dropped_bytes > 0
    assert max(missing) < min(received)  # the oldest went first
    assert registry.get_sample_value("goodput_exporter_dropped_records_total") == len(missing)
    assert registry.get_sample_value("goodput_exporter_exported_records_total") == len(received)
    assert registry.get_sample_value("goodput_exporter_dropped_bytes_total") == (
        stats.num_dropped_bytes
    )
    assert registry.get_sample_value("goodput_exporter_buffer_bytes") == 0
