"""A crash after a checkpoint: the stored rollups and the log's replay give the engine back
the rejections per priority class and the other vantage's sketches exactly once."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from controlplane.goodput import GoodputEngine, MinuteRollup, SLOSpec
from controlplane.ingest import Deduplicator, Ingestor
from controlplane.ingest.replay import replay
from controlplane.ingest.wal import WriteAheadLog
from exporters.records import Labels, RecordBatch, RequestRecord, Status, Vantage
from exporters.slo import Metric, Objective
from exporters.wire import CONTENT_TYPE_BINARY, BatchHeader, encode_batch

NOW = 1_700_000_000.0
EPOCH = "b" * 32
SPEC = SLOSpec(
    id="all", name="all", objectives=(Objective(Metric.TTFT, 0.2),), target=0.9, window_s=86_400
)


def batch(prefix: str, finish_ago_s: float) -> RecordBatch:
    """Two OK requests at each vantage (TTFT 0.1 s at the gateway, 0.03 s at the engine)
    and three rejected ones in two priority classes, finishing ``finish_ago_s`` before NOW."""
    finish_ns = int((NOW - finish_ago_s) * 1e9)
    records = [
        RequestRecord(
            request_id=f"{prefix}-{vantage.name}-{k}",
            vantage=vantage,
            arrival_time_ns=finish_ns - ttft_us * 1000,
            labels=Labels(model="m"),
            emission_offsets_us=np.array([ttft_us]),
        )
        for vantage, ttft_us in ((Vantage.GATEWAY, 100_000), (Vantage.ENGINE, 30_000))
        for k in range(2)
    ]
    records += [
        RequestRecord(
            request_id=f"{prefix}-rejected-{k}",
            vantage=Vantage.GATEWAY,
            arrival_time_ns=finish_ns,
            labels=Labels(model="m", priority=priority),
            emission_offsets_us=np.zeros(0, dtype=np.int64),
            status=Status.REJECTED,
        )
        for k, priority in enumerate(("batch", "batch", "interactive"))
    ]
    return RecordBatch.from_records(records)


def ingestor(wal: WriteAheadLog | None = None) -> Ingestor:
    engine = GoodputEngine(clock=lambda: NOW, other_vantage=True)
    engine.set_slos([SPEC])
    return Ingestor(engine, Deduplicator(), wal)


def send(target: Ingestor, data: RecordBatch, seq: int) -> None:
    body = encode_batch(data, exporter_id="gw", seq=seq)
    target.apply(BatchHeader("gw", seq, int(NOW * 1e9)), data, body=(body, CONTENT_TYPE_BINARY))


def test_rollups_and_replay_restore_classes_and_vantages_once(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, EPOCH)
    first = ingestor(wal)
    send(first, batch("old", finish_ago_s=600), 0)  # in the stored rollups
    send(first, batch("now", finish_ago_s=1), 1)  # the current minute: in the log only
    cut = first.cut(NOW)
    stored: list[MinuteRollup] = cut.rollups
    assert [r.rejected_by_class for r in stored] == [{"batch": 2, "interactive": 1}]
    send(first, batch("late", finish_ago_s=900), 2)  # late, after the cut
    send(first, batch("late", finish_ago_s=900), 2)  # a resend: counted once
    wal.close()  # kill -9

    again = ingestor()
    again.engine.load_rollups(stored)
    replay(
        again, WriteAheadLog(tmp_path, EPOCH), segment=cut.segment,
        covered_until_minute=int(NOW) // 60, dedup=cut.dedup,
    )  # fmt: skip
    assert again.engine.rejected_by_class("all", "1d") == {"batch": 6, "interactive": 3}
    assert again.engine.rejected_by_class("all", "1d") == first.engine.rejected_by_class(
        "all", "1d"
    )
    assert again.engine.vantage_percentiles("all", "1h") == first.engine.vantage_percentiles(
        "all", "1h"
    )
    engine_ttft = again.engine.vantage_percentiles("all", "1h")["engine"]["ttft"]
    assert engine_ttft.p50_s is not None and abs(engine_ttft.p50_s - 0.03) < 0.001
