"""Write-ahead log entries of applied batches, checkpoint cuts, and the replay at start.

An entry is a msgpack map: ``x`` the exporter id and ``s`` the seq of a wire batch (absent
for OTLP), ``c`` the content type and ``b`` the body as received (for OTLP, and for a
batch applied without its body, the taken records encoded with the wire codec), ``r`` the
rows the screen refused (``<u4`` bytes; they are left out again at replay). A ``void``
entry says the entry before it was logged but not applied (the engine raised).

:func:`replay` rebuilds, exactly once, what the stored rollups do not cover: given the
checkpoint (segment ``k``, minute ``U``, de-duplication snapshot), segments up to ``k``
contribute only their records finishing at minute ``U`` or later (the rollups up to ``U``
hold the others), later segments everything. A batch logged twice (applied, not
acknowledged, resent) is applied once: entries are de-duplicated by ``(exporter_id, seq)``
across the whole replay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from controlplane.goodput import MinuteRollup
from controlplane.ingest.screen import Screened, finish_seconds
from controlplane.ingest.wal import WriteAheadLog, decode_entry
from exporters.records import RecordBatch
from exporters.wire import CONTENT_TYPE_BINARY, BatchHeader, decode_any, encode_batch

__all__ = ["VOID_ENTRY", "Cut", "ReplayStats", "entry_batch", "log_entry", "replay"]

logger = logging.getLogger(__name__)

VOID_ENTRY: dict[str, Any] = {"void": True}
_OTLP_EXPORTER = "otlp"


@dataclass(frozen=True, slots=True)
class Cut:
    """What a checkpoint covers: the last sealed segment, the de-duplication state at the
    cut, and the engine's rollups taken at the same instant."""

    segment: int
    dedup: bytes
    rollups: list[MinuteRollup]


@dataclass(frozen=True, slots=True)
class ReplayStats:
    """What a replay did: entries read, batches applied, records applied, duplicates."""

    num_entries: int
    num_batches: int
    num_records: int
    num_duplicates: int


def log_entry(
    screened: Screened, header: BatchHeader | None, body: tuple[bytes, str] | None
) -> dict[str, Any]:
    """The log entry of a screened batch (see the module)."""
    entry: dict[str, Any] = {}
    if header is not None:
        entry["x"], entry["s"] = header.exporter_id, header.seq
    if body is not None:
        refused = np.array([r.index for r in screened.rejections], dtype="<u4")
        entry["b"], entry["c"], entry["r"] = body[0], body[1], refused.tobytes()
    else:
        entry["b"] = encode_batch(
            screened.batch,
            exporter_id=header.exporter_id if header else _OTLP_EXPORTER,
            seq=header.seq if header else 0,
        )
        entry["c"], entry["r"] = CONTENT_TYPE_BINARY, b""
    return entry


def entry_batch(entry: dict[str, Any]) -> RecordBatch:
    """The records an entry applied (its body decoded, the refused rows left out)."""
    _, batch = decode_any(entry["b"], entry["c"])
    refused = np.frombuffer(entry["r"], dtype="<u4")
    if refused.shape[0]:
        keep = np.ones(len(batch), dtype=np.bool_)
        keep[refused] = False
        batch = batch.take(keep)
    return batch


def _entries(wal: WriteAheadLog, segment_index: int) -> list[dict[str, Any]]:
    """The applied entries of one segment (a void entry cancels the one before it)."""
    out: list[dict[str, Any]] = []
    for payload in wal.sealed[segment_index].entries():
        entry = decode_entry(payload)
        if entry.get("void"):
            if out:
                out.pop()
            continue
        out.append(entry)
    return out


def replay(
    ingestor: Any, wal: WriteAheadLog, *, segment: int, covered_until_minute: int, dedup: bytes
) -> ReplayStats:
    """Apply the log's sealed segments to ``ingestor``'s engine and de-duplication state,
    past the checkpoint ``(segment, covered_until_minute, dedup)`` (see the module)."""
    seen: set[tuple[str, int]] = set()
    num_entries = num_batches = num_records = num_duplicates = 0
    with ingestor.lock:
        ingestor.dedup.restore(dedup)
        for index, sealed in enumerate(wal.sealed):
            for entry in _entries(wal, index):
                num_entries += 1
                key = (entry["x"], entry["s"]) if "x" in entry else None
                if key is not None:
                    if key in seen:
                        num_duplicates += 1
                        continue
                    seen.add(key)
                batch = entry_batch(entry)
                finish_minute = finish_seconds(batch) // 60
                if len(batch):
                    sealed.max_finish_minute = max(
                        sealed.max_finish_minute, int(finish_minute.max())
                    )
                if sealed.k <= segment:  # the stored rollups hold what finished before U
                    batch = batch.take(finish_minute >= covered_until_minute)
                if len(batch):
                    ingestor.engine.ingest(batch, validate=False)
                    num_batches += 1
                    num_records += len(batch)
                if key is not None:
                    ingestor.dedup.mark(*key)
    stats = ReplayStats(num_entries, num_batches, num_records, num_duplicates)
    if num_entries:
        logger.warning(
            "write-ahead log replayed: %d entries, %d records applied past the checkpoint "
            "(segment %d, minute %d), %d duplicate entries skipped",
            num_entries,
            num_records,
            segment,
            covered_until_minute,
            num_duplicates,
        )
    return stats
