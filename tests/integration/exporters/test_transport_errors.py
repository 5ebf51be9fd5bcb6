"""ControlPlaneExporter's answers to refusals, throttling, bad records and shutdown, over
real HTTP on loopback."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from exporters._transport_queue import Backoff, retry_after_s, split_batches
from exporters.recorder import RequestRecorder
from exporters.records import RequestRecord, Vantage
from exporters.transport import ControlPlaneExporter
from exporters.wire import CONTENT_TYPE_BINARY

if TYPE_CHECKING:
    from tests.integration.exporters.conftest import IngestServer, Receiver

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def fast_exporter(url: str, **kwargs: object) -> ControlPlaneExporter:
    settings: dict[str, object] = {
        "flush_interval_s": 0.02,
        "max_batch_records": 5,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "timeout_s": 2.0,
    }
    settings.update(kwargs)
    return ControlPlaneExporter(url, **settings)  # type: ignore[arg-type]


def finish_requests(exporter: ControlPlaneExporter, prefix: str, n: int) -> None:
    recorder = RequestRecorder(Vantage.ENGINE, exporter)
    for i in range(n):
        trace = recorder.start(f"{prefix}{i}")
        trace.token()
        trace.finish()


def test_a_4xx_drops_the_batch_counts_it_rejected_and_logs_once(
    server: IngestServer, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.script.extend([400, 400])
    exporter = fast_exporter(server.url)
    try:
        with caplog.at_level(logging.ERROR, logger="exporters.transport"):
            for prefix in ("a", "b", "c"):
                finish_requests(exporter, prefix, 5)
                assert exporter.force_flush(5.0) is True
    finally:
        exporter.shutdown(2.0)

    stats = exporter.stats()
    assert (stats.num_rejected_records, stats.num_rejected_batches) == (10, 2)
    assert (stats.num_exported_records, stats.num_retries) == (5, 0)
    assert sorted(receiver.request_ids()) == [f"c{i}" for i in range(5)]
    rejections = [r for r in caplog.records if "rejected batch" in r.getMessage()]
    assert len(rejections) == 1
    assert "with HTTP 400" in rejections[0].getMessage()


def test_429_and_5xx_are_retried_under_the_same_seq_honouring_retry_after(
    server: IngestServer, receiver: Receiver
) -> None:
    receiver.script.extend([(429, {"Retry-After": "0.03"}), 503])
    exporter = fast_exporter(server.url)
    try:
        started = time.monotonic()
        finish_requests(exporter, "r", 5)
        assert exporter.force_flush(5.0) is True
        elapsed = time.monotonic() - started
    finally:
        exporter.shutdown(2.0)

    stats = exporter.stats()
    assert (stats.num_retries, stats.num_exported_records, stats.num_sent_batches) == (2, 5, 1)
    assert receiver.seqs == [0]
    assert elapsed >= 0.03  # waited at least what Retry-After asked
    assert len(receiver.headers) == 3  # one refused, one failed, one accepted


def test_requests_carry_the_binary_content_type_and_the_bearer_key(
    server: IngestServer, receiver: Receiver
) -> None:
    with_key = fast_exporter(server.url, api_key="s3cret", exporter_id="gw-7")
    without_key = fast_exporter(server.url)
    try:
        finish_requests(with_key, "k", 1)
        finish_requests(without_key, "n", 1)
        assert with_key.force_flush(5.0) and without_key.force_flush(5.0)
    finally:
        with_key.shutdown(2.0)
        without_key.shutdown(2.0)

    by_auth = {h.get("Authorization"): h for h in receiver.headers}
    assert set(by_auth) == {"Bearer s3cret", None}
    assert all(h["Content-Type"] == CONTENT_TYPE_BINARY for h in receiver.headers)
    assert ("gw-7", 0) in receiver.seen


def test_a_record_breaking_the_contract_is_rejected_alone(
    server: IngestServer, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = fast_exporter(server.url)
    recorder = RequestRecorder(Vantage.GATEWAY, exporter)
    bad = RequestRecord(
        request_id="bad",
        vantage=Vantage.GATEWAY,
        arrival_time_ns=1,
        emission_offsets_us=np.array([30, 10], dtype=np.int64),  # time runs backwards
    )
    try:
        with caplog.at_level(logging.ERROR, logger="exporters.transport"):
            recorder.start("good-1").finish()
            exporter.export(bad)
            recorder.start("good-2").finish()
            assert exporter.force_flush(5.0) is True
    finally:
        exporter.shutdown(2.0)

    assert sorted(receiver.request_ids()) == ["good-1", "good-2"]
    stats = exporter.stats()
    assert (stats.num_rejected_records, stats.num_exported_records) == (1, 2)
    assert any("'bad' that cannot be encoded" in r.getMessage() for r in caplog.records)


def test_shutdown_with_the_control_plane_gone_is_bounded_and_counts_every_record(
    server: IngestServer, receiver: Receiver
) -> None:
    server.stop()
    exporter = fast_exporter(server.url)
    finish_requests(exporter, "r", 12)
    assert exporter.force_flush(0.1) is False

    started = time.monotonic()
    exporter.shutdown(0.3)
    assert time.monotonic() - started < 1.0
    exporter.shutdown(0.3)  # idempotent
    exporter.export(_record("late"))

    stats = exporter.stats()
    assert stats.num_dropped_records == 13  # 12 undelivered at shutdown + 1 after it
    assert stats.num_exported_records == 0
    assert (stats.num_buffered_batches, stats.num_pending_records) == (0, 0)
    assert receiver.count() == 0


def test_batches_are_cut_by_size_as_well_as_by_count(
    server: IngestServer, receiver: Receiver
) -> None:
    exporter = fast_exporter(server.url, max_batch_records=100, max_batch_bytes=3000)
    recorder = RequestRecorder(Vantage.GATEWAY, exporter)
    try:
        for i in range(6):
            trace = recorder.start(f"long-{i}")
            for _ in range(200):  # ~2.4 kB each by the exporter's upper bound
                trace.token()
            trace.finish()
        assert exporter.force_flush(5.0) is True
    finally:
        exporter.shutdown(2.0)

    assert sorted(receiver.request_ids()) == [f"long-{i}" for i in range(6)]
    assert sorted(receiver.seqs) == list(range(6))  # one request per batch
    assert all(r.output_tokens == 200 for r in receiver.records)


def test_an_exporter_left_open_flushes_at_interpreter_exit(
    server: IngestServer, receiver: Receiver
) -> None:
    script = (
        "from exporters.recorder import RequestRecorder\n"
        "from exporters.records import Vantage\n"
        "from exporters.transport import ControlPlaneExporter\n"
        f"exporter = ControlPlaneExporter({server.url!r}, flush_interval_s=60.0)\n"
        "recorder = RequestRecorder(Vantage.GATEWAY, exporter)\n"
        "for i in range(3):\n"
        "    recorder.start(f'exit-{i}').finish()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(receiver.request_ids()) == ["exit-0", "exit-1", "exit-2"]


def test_backoff_doubles_with_jitter_up_to_the_cap_and_honours_retry_after() -> None:
    draws = iter([0.0, 1.0, 0.5, 1.0, 1.0, 0.0])
    backoff = Backoff(0.1, 1.0, rand=lambda: next(draws))
    delays = [backoff.next_delay_s() for _ in range(5)]
    assert delays == pytest.approx([0.05, 0.2, 0.3, 0.8, 1.0])  # [d/2, d], d = 0.1 * 2**k
    assert backoff.next_delay_s(retry_after_s=3.0) == 1.0  # Retry-After, capped
    backoff.reset()
    assert backoff.attempt == 0
    assert (retry_after_s("2.5"), retry_after_s(None), retry_after_s("-1")) == (2.5, None, None)
    assert retry_after_s("Wed, 21 Oct 2026 07:28:00 GMT") is None


def test_split_batches_cuts_by_count_and_by_estimated_bytes() -> None:
    short = [_record(f"s{i}") for i in range(5)]
    assert [len(b) for b in split_batches(short, 2, 1 << 20)] == [2, 2, 1]
    long = RequestRecord(
        request_id="long",
        vantage=Vantage.GATEWAY,
        arrival_time_ns=1,
        emission_offsets_us=np.arange(1000, dtype=np.int64),
    )
    assert [len(b) for b in split_batches([*short[:2], long, *short[2:]], 100, 2000)] == [
        2,
        1,
        3,
    ]


def test_constructor_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="url must start with http:// or https://, got 'ftp://x'"):
        ControlPlaneExporter("ftp://x")
    with pytest.raises(ValueError, match="max_batch_records must be >= 1, got 0"):
        ControlPlaneExporter("http://127.0.0.1:9", max_batch_records=0)
    with pytest.raises(ValueError, match="max_batch_bytes must be >= 1, got -1"):
        ControlPlaneExporter("http://127.0.0.1:9", max_batch_bytes=-1)
    with pytest.raises(ValueError, match="max_buffer_bytes must be >= 1, got 0"):
        ControlPlaneExporter("http://127.0.0.1:9", max_buffer_bytes=0)
    with pytest.raises(ValueError, match="backoff must satisfy 0 < backoff_initial_s"):
        ControlPlaneExporter("http://127.0.0.1:9", backoff_initial_s=2.0, backoff_max_s=1.0)


def _record(request_id: str) -> RequestRecord:
    return RequestRecord(request_id=request_id, vantage=Vantage.GATEWAY, arrival_time_ns=1)
