"""The ingestor: once per (exporter_id, seq), whole batches, tenant scope, counters."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from controlplane.goodput import GoodputEngine, SLOSpec
from controlplane.ingest import (
    Deduplicator,
    IngestCollector,
    IngestFailedError,
    Ingestor,
    StaleBatchError,
    TenantScopeError,
)
from exporters.records import Labels, RecordBatch, RequestRecord, Status, Vantage
from exporters.slo import Metric, Objective
from exporters.wire import BatchHeader

NOW = 1_700_000_000.0
SPEC = SLOSpec(
    id="chat",
    name="chat",
    objectives=(Objective(Metric.TTFT, 0.2),),
    target=0.9,
    window_s=86_400,
)


def batch(*ttfts_us: int, tenant: str = "acme", status: Status = Status.OK) -> RecordBatch:
    records = [
        RequestRecord(
            request_id=f"r{k}",
            vantage=Vantage.GATEWAY,
            arrival_time_ns=int((NOW - 30) * 1e9),
            labels=Labels(model="llama", tenant=tenant),
            emission_offsets_us=np.array([ttft, ttft + 20_000, ttft + 40_000]),
            status=status,
        )
        for k, ttft in enumerate(ttfts_us)
    ]
    return RecordBatch.from_records(records)


def header(seq: int, exporter: str = "gw-0") -> BatchHeader:
    return BatchHeader(exporter, seq, int(NOW * 1e9))


@pytest.fixture
def ingestor() -> Ingestor:
    engine = GoodputEngine(clock=lambda: NOW)
    engine.set_slos([SPEC])
    return Ingestor(engine, Deduplicator(window=4))


def test_a_batch_counts_once_however_often_it_arrives(ingestor: Ingestor) -> None:
    data = batch(100_000, 300_000)
    first = ingestor.apply(header(0), data, validated=False)
    again = ingestor.apply(header(0), data, validated=False)
    assert (first.duplicate, first.num_records, first.num_final, first.num_tokens) == (
        False,
        2,
        2,
        6,
    )
    assert first.num_emissions == 6
    assert (again.duplicate, again.num_records, again.num_tokens) == (True, 0, 0)
    stats = ingestor.engine.query("chat", "1m")
    assert (stats.requests, stats.good) == (2, 1)


def test_a_stale_seq_is_refused_naming_the_window(ingestor: Ingestor) -> None:
    ingestor.apply(header(10), batch(100_000), validated=False)
    with pytest.raises(StaleBatchError) as info:
        ingestor.apply(header(6), batch(100_000), validated=False)
    assert str(info.value) == (
        "seq: 6 of exporter 'gw-0' is below the de-duplication window (highest seq applied "
        "10, window 4); an exporter that restarts must use a new exporter_id"
    )
    assert ingestor.engine.query("chat", "1m").requests == 1


def test_a_tenant_scoped_key_may_only_send_its_tenant(ingestor: Ingestor) -> None:
    mixed = RecordBatch.concat([batch(100_000), batch(100_000, tenant="other")])
    with pytest.raises(TenantScopeError) as info:
        ingestor.apply(header(0), mixed, tenant="acme", validated=False)
    assert str(info.value) == (
        "labels.tenant: this key is scoped to tenant 'acme'; the batch has records labelled 'other'"
    )
    assert ingestor.engine.query("chat", "1m").requests == 0
    assert ingestor.dedup.check("gw-0", 0).value == "new"  # refused batches are not marked
    assert not ingestor.apply(header(0), batch(1), tenant="acme", validated=False).duplicate


class FailingEngine(GoodputEngine):
    def __init__(self) -> None:
        super().__init__(clock=lambda: NOW)
        self.fail = True

    def ingest(
        self, batch: RecordBatch, *, validate: bool = True, now: float | None = None
    ) -> None:
        if self.fail:
            raise RuntimeError("boom")
        super().ingest(batch, validate=validate, now=now)


def test_an_engine_failure_marks_nothing_so_a_retry_applies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = FailingEngine()
    engine.set_slos([SPEC])
    ingestor = Ingestor(engine, Deduplicator())
    with pytest.raises(IngestFailedError, match="failed on this batch \\(RuntimeError\\)"):
        ingestor.apply(header(0), batch(100_000), validated=False)
    assert "goodput engine failed on a wire batch of 1 records" in caplog.text
    engine.fail = False
    assert not ingestor.apply(header(0), batch(100_000), validated=False).duplicate
    assert engine.query("chat", "1m").requests == 1


def test_counters_reach_prometheus(ingestor: Ingestor) -> None:
    registry = CollectorRegistry()
    registry.register(IngestCollector(ingestor))
    ingestor.apply(header(0), batch(100_000, 100_000), validated=False, num_bytes=100)
    ingestor.apply(header(0), batch(100_000), validated=False, num_bytes=40)
    ingestor.apply_unsequenced(batch(100_000), num_bytes=7)
    ingestor.count_rejected("wire", 5)
    ingestor.count_spans(mapped=1, ignored=2, rejected=3)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("goodput_ingest_batches_total", protocol="wire", outcome="applied") == 1
    assert value("goodput_ingest_batches_total", protocol="wire", outcome="duplicate") == 1
    assert value("goodput_ingest_batches_total", protocol="wire", outcome="rejected") == 1
    assert value("goodput_ingest_batches_total", protocol="otlp", outcome="applied") == 1
    assert value("goodput_ingest_records_total", protocol="wire") == 2
    assert value("goodput_ingest_tokens_total", protocol="wire") == 6
    assert value("goodput_ingest_received_bytes_total", protocol="wire") == 145
    assert value("goodput_ingest_otlp_spans_total", outcome="ignored") == 2
    assert value("goodput_ingest_dedup_exporters") == 1
    assert value("goodput_ingest_dedup_evicted_total") == 0
