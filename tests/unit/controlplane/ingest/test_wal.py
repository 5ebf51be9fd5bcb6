"""The ingest write-ahead log: entries, torn tails, segments, one owner, and the replay that
gives the engine back exactly what the checkpoint does not cover."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from controlplane.goodput import GoodputEngine, SLOSpec
from controlplane.ingest import Deduplicator, Ingestor
from controlplane.ingest.replay import replay
from controlplane.ingest.wal import WalError, WriteAheadLog
from exporters.records import Labels, RecordBatch, RequestRecord, Vantage
from exporters.slo import Metric, Objective
from exporters.wire import CONTENT_TYPE_BINARY, BatchHeader, encode_batch

NOW = 1_700_000_000.0
EPOCH = "a" * 32
SPEC = SLOSpec(
    id="all", name="all", objectives=(Objective(Metric.TTFT, 0.2),), target=0.9, window_s=86_400
)


def batch(n: int, finish_ago_s: float = 30.0, prefix: str = "r") -> RecordBatch:
    arrival_ns = int((NOW - finish_ago_s - 0.1) * 1e9)
    return RecordBatch.from_records(
        [
            RequestRecord(
                request_id=f"{prefix}{k}",
                vantage=Vantage.GATEWAY,
                arrival_time_ns=arrival_ns,
                labels=Labels(model="m"),
                emission_offsets_us=np.array([100_000]),
            )
            for k in range(n)
        ]
    )


def ingestor(wal: WriteAheadLog | None = None) -> Ingestor:
    engine = GoodputEngine(clock=lambda: NOW)
    engine.set_slos([SPEC])
    return Ingestor(engine, Deduplicator(), wal)


def send(target: Ingestor, data: RecordBatch, seq: int, exporter: str = "gw") -> None:
    body = encode_batch(data, exporter_id=exporter, seq=seq)
    header = BatchHeader(exporter, seq, int(NOW * 1e9))
    target.apply(header, data, body=(body, CONTENT_TYPE_BINARY))


def counted(target: Ingestor) -> int:
    return target.engine.query("all", "1h").requests


def test_a_restart_replays_every_acknowledged_batch_once(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, EPOCH)
    first = ingestor(wal)
    send(first, batch(3), 0)
    send(first, batch(2, prefix="s"), 1)
    send(first, batch(2, prefix="s"), 1)  # a resend: a duplicate, not logged again
    assert counted(first) == 5
    wal.close()  # kill -9: nothing else happens

    again = ingestor()
    reopened = WriteAheadLog(tmp_path, EPOCH)
    stats = replay(again, reopened, segment=-1, covered_until_minute=0, dedup=b"")
    assert (stats.num_entries, stats.num_records, stats.num_duplicates) == (2, 5, 0)
    assert counted(again) == 5
    again.wal = reopened
    send(again, batch(2, prefix="s"), 1)  # the exporter resends after the crash
    assert counted(again) == 5  # the de-duplication state came back with the log


def test_the_checkpoint_covers_what_the_rollups_hold(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, EPOCH)
    first = ingestor(wal)
    send(first, batch(4, finish_ago_s=600), 0)  # finished 10 min ago: in the stored rollups
    send(first, batch(1, finish_ago_s=1, prefix="now"), 1)  # the current minute: not yet
    cut = first.cut(NOW)
    covered = int(NOW) // 60
    send(first, batch(2, finish_ago_s=900, prefix="late"), 2)  # late, after the cut
    wal.close()

    again = ingestor()
    stats = replay(
        again, WriteAheadLog(tmp_path, EPOCH), segment=cut.segment,
        covered_until_minute=covered, dedup=cut.dedup,
    )  # fmt: skip
    # The 4 records before the cut are in the rollups; the current minute's one and the
    # late ones after the cut are not.
    assert stats.num_records == 3
    assert counted(again) == 3


def test_a_torn_tail_ends_the_segment_and_other_epochs_are_dropped(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, EPOCH)
    send(ingestor(wal), batch(2), 0)
    path = wal.current.path
    wal.close()
    with path.open("ab") as file:
        file.write(b"\x10\x00\x00\x00garbage")  # a crash in the middle of a write
    (tmp_path / f"{'b' * 32}-000000000000.wal").write_bytes(b"old")
    reopened = WriteAheadLog(tmp_path, EPOCH)
    assert not (tmp_path / f"{'b' * 32}-000000000000.wal").exists()
    again = ingestor()
    assert replay(again, reopened, segment=-1, covered_until_minute=0, dedup=b"").num_records == 2


def test_one_process_owns_the_folder(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, EPOCH)
    with pytest.raises(WalError, match="in use by another process"):
        WriteAheadLog(tmp_path, EPOCH)
    wal.close()
    WriteAheadLog(tmp_path, EPOCH).close()


def test_released_segments_are_deleted_only_when_covered(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, EPOCH)
    target = ingestor(wal)
    send(target, batch(1, finish_ago_s=600), 0)
    old = target.cut(NOW).segment
    send(target, batch(1, finish_ago_s=1, prefix="n"), 1)
    recent = target.cut(NOW).segment
    assert wal.release(recent, int(NOW) // 60) == 1  # the current minute's segment stays
    assert [s.k for s in wal.sealed] == [recent] and old < recent
    wal.close()
