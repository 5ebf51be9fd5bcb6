"""Applying decoded batches to the goodput engine: de-duplicated, whole, and counted.

:class:`Ingestor` is the one door from the network to the engine. For a wire batch it
checks ``(exporter_id, seq)`` (:mod:`controlplane.ingest.dedup`), applies the whole batch
with one :meth:`GoodputEngine.ingest` call, and only then marks the pair as applied, all
under one lock, so two copies of a batch racing on two connections count once. The work
is per batch: a few numpy passes for the counts and the tenant check, no Python per record.

Outcomes are counted by protocol (``wire``, ``otlp``) and exposed to Prometheus by
:class:`IngestCollector`. Control loops that learn from the records (the PD planner's
demand, admission's latency model) register a listener (:meth:`Ingestor.add_listener`):
it gets every applied batch, after the engine, under the lock; one that raises is logged
and counted (``listener_failures``) and never fails the ingest.

Example::

    ingestor = Ingestor(engine, Deduplicator())
    header, batch = decode_any(body, content_type)
    outcome = ingestor.apply(header, batch)       # IngestOutcome(duplicate=False, ...)
    again = ingestor.apply(header, batch)         # duplicate=True, nothing applied
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from controlplane.goodput import GoodputEngine
from controlplane.ingest.dedup import Deduplicator, SeqVerdict
from controlplane.ingest.fleet_log import FleetLog, FleetRow
from controlplane.ingest.replay import VOID_ENTRY, Cut, log_entry
from controlplane.ingest.screen import RecordRejection, finish_seconds, screen
from controlplane.ingest.wal import WalError, WriteAheadLog
from exporters.records import RecordBatch
from exporters.wire import BatchHeader

__all__ = [
    "OUTCOMES",
    "PROTOCOLS",
    "IngestCollector",
    "IngestFailedError",
    "IngestOutcome",
    "Ingestor",
    "Listener",
    "StaleBatchError",
    "TenantScopeError",
    "check_tenant",
]

logger = logging.getLogger(__name__)

#: ``listener(batch, exporter_id)``: a control loop learning from applied batches.
Listener = Callable[[RecordBatch, str], None]

PROTOCOLS = ("wire", "otlp")
#: applied; duplicate (seen before, nothing applied); stale (below the de-duplication
#: window, refused); rejected (bad input, nothing applied); failed (the engine raised).
OUTCOMES = ("applied", "duplicate", "stale", "rejected", "failed")


class StaleBatchError(ValueError):
    """A ``seq`` below the exporter's de-duplication window (see the dedup module)."""


class TenantScopeError(ValueError):
    """A tenant-scoped key sent records labelled with another tenant."""


class IngestFailedError(RuntimeError):
    """The engine raised on a batch that passed validation: nothing was marked applied."""


@dataclass(frozen=True, slots=True)
class IngestOutcome:
    """What one batch did. Counts are of what was *applied* (all 0 for a duplicate):
    ``num_records`` rows, ``num_final`` final rows among them, ``num_emissions`` token
    emissions, ``num_tokens`` output tokens. ``rejections``: the records of the batch that
    were not taken (:mod:`controlplane.ingest.screen`), each with its row and reason."""

    duplicate: bool
    exporter_id: str
    seq: int
    num_records: int
    num_final: int
    num_emissions: int
    num_tokens: int
    rejections: tuple[RecordRejection, ...] = ()


class _Counts:
    """Plain integer counters (updated under the ingestor's lock, read at scrape time)."""

    def __init__(self) -> None:
        self.batches = {(p, o): 0 for p in PROTOCOLS for o in OUTCOMES}
        self.records = dict.fromkeys(PROTOCOLS, 0)
        self.rejected_records = dict.fromkeys(PROTOCOLS, 0)
        self.tokens = dict.fromkeys(PROTOCOLS, 0)
        self.bytes = dict.fromkeys(PROTOCOLS, 0)
        self.spans = {"mapped": 0, "ignored": 0, "rejected": 0}


class Ingestor:
    """De-duplicates and applies batches to ``engine`` (see the module). Thread-safe."""

    def __init__(
        self, engine: GoodputEngine, dedup: Deduplicator, wal: WriteAheadLog | None = None
    ) -> None:
        self.engine = engine
        self.dedup = dedup
        #: The write-ahead log (``None``: acknowledgements are not durable).
        self.wal = wal
        #: The fleet's shared log (``None``: this replica counts what it receives). With
        #: it, a batch is logged, not counted, and :meth:`apply_rows` counts every
        #: replica's batches in the log's order (docs/scale-out.md).
        self.fleet: FleetLog | None = None
        #: The last fleet log transaction applied (the checkpoint's cursor).
        self.fleet_cursor = 0
        #: Rows of the fleet log applied, and those skipped as duplicates.
        self.fleet_rows = {"applied": 0, "duplicate": 0}
        self._checkpoint_keys: set[tuple[str, int]] = set()
        #: Why ingest is refused (503) while the runtime has no log it may write.
        self.refusal: str | None = None
        self.lock = self._lock = threading.Lock()
        self._counts = _Counts()
        self._warned_stale: set[str] = set()
        self._listeners: list[Listener] = []
        self.listener_failures = 0

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(batch, exporter_id)`` with every batch applied from now on (keep
        it cheap: it runs under the ingest lock). ``exporter_id`` is the sending exporter's
        (one process: a gateway, or one engine instance); ``""`` for OTLP batches."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def apply(
        self,
        header: BatchHeader,
        batch: RecordBatch,
        *,
        tenant: str | None = None,
        num_bytes: int = 0,
        validated: bool = True,
        body: tuple[bytes, str] | None = None,
    ) -> IngestOutcome:
        """Apply a decoded wire batch once per ``(exporter_id, seq)``.

        ``tenant``: the key's tenant scope (every record must carry it). ``validated``:
        the batch came from the wire decoder, which validated it. ``body``: the request
        body and content type it was decoded from (the write-ahead log stores them as they
        came; without it the batch is encoded again). With a write-ahead log, returns once
        the batch is on disk. Raises :class:`StaleBatchError`, :class:`TenantScopeError`,
        :class:`IngestFailedError`.
        """
        self._check_open()
        check_tenant(batch, tenant)
        with self._lock:
            verdict = self.dedup.check(header.exporter_id, header.seq)
            if verdict is SeqVerdict.STALE:
                self._count("wire", "stale", num_bytes)
                high = self.dedup.high_water_mark(header.exporter_id)
                self._warn_stale(header.exporter_id, header.seq, high)
                raise StaleBatchError(
                    f"seq: {header.seq} of exporter {header.exporter_id!r} is below the "
                    f"de-duplication window (highest seq applied {high}, window "
                    f"{self.dedup.window}); an exporter that restarts must use a new "
                    "exporter_id"
                )
            if verdict is SeqVerdict.DUPLICATE:
                self._count("wire", "duplicate", num_bytes)
                return IngestOutcome(True, header.exporter_id, header.seq, 0, 0, 0, 0)
            outcome, position = self._ingest(batch, "wire", num_bytes, validated, header, body=body)
            if self.fleet is None:  # with the fleet log, the reader marks it when it counts it
                self.dedup.mark(header.exporter_id, header.seq)
        self._sync(position)
        return outcome

    def apply_unsequenced(
        self, batch: RecordBatch, *, tenant: str | None = None, num_bytes: int = 0
    ) -> IngestOutcome:
        """Apply an OTLP-mapped batch (no sequence numbers, so no de-duplication)."""
        self._check_open()
        check_tenant(batch, tenant)
        with self._lock:
            outcome, position = self._ingest(batch, "otlp", num_bytes, False, None, body=None)
        self._sync(position)
        return outcome

    def cut(self, until_time: float) -> Cut:
        """One consistent cut for a checkpoint, under the ingest lock: seal the log's
        current segment, snapshot the de-duplication state, take the engine's rollups of
        the minutes complete by ``until_time``."""
        with self._lock:
            if self.fleet is not None:
                segment = self.fleet_cursor
            else:
                segment = self.wal.rotate() if self.wal is not None else -1
            return Cut(segment, self.dedup.snapshot(), self.engine.rollups(until_time))

    def apply_rows(self, rows: list[FleetRow], *, covered: tuple[int, int] | None = None) -> int:
        """Count rows of the fleet log (every replica's batches, in the log's order) into
        the engine, once per ``(exporter_id, seq)``; returns the records applied.
        ``covered``: ``(txid, minute)`` of the checkpoint the stored rollups were loaded
        from: rows up to that transaction add only their records finishing at that minute
        or later (the rollups hold the others).

        The ingest lock is held for one transaction's rows at a time, not the whole read:
        the requests waiting on it (their de-duplication check, their append) pass between
        transactions, and a checkpoint's cut still falls between two whole transactions."""
        applied = 0
        start = 0
        while start < len(rows):
            end = start + 1
            while end < len(rows) and rows[end].txid == rows[start].txid:
                end += 1
            applied += self._apply_transaction(rows[start:end], covered)
            start = end
        return applied

    def _apply_transaction(self, rows: list[FleetRow], covered: tuple[int, int] | None) -> int:
        """:meth:`apply_rows` for the rows of one fleet log transaction, under the lock."""
        applied = 0
        with self._lock:
            for row in rows:
                key = row.key
                under = covered is not None and row.txid <= covered[0]
                if key is not None and self._seen_before(key, under):
                    self.fleet_rows["duplicate"] += 1
                    self.fleet_cursor = row.txid
                    continue
                batch = row.batch
                if covered is not None and under:
                    batch = batch.take(finish_seconds(batch) // 60 >= covered[1])
                if len(batch):
                    self.engine.ingest(batch, validate=False)
                    self._after_apply(batch, "wire" if key else "otlp", key[0] if key else "")
                    applied += len(batch)
                if key is not None:
                    self.dedup.mark(*key)
                self.fleet_rows["applied"] += 1
                self.fleet_cursor = row.txid
        return applied

    def _seen_before(self, key: tuple[str, int], under_checkpoint: bool) -> bool:
        """Whether a fleet row's batch was counted already. The de-duplication state
        restored from a checkpoint knows every batch up to its cursor, whose late records
        are counted again on a restart: there a row is a duplicate only of an earlier row
        read since the start (as the local log's replay)."""
        if under_checkpoint:
            if key in self._checkpoint_keys:
                return True
            self._checkpoint_keys.add(key)
            return False
        self._checkpoint_keys.clear()
        return self.dedup.check(*key) is not SeqVerdict.NEW

    def _check_open(self) -> None:
        if self.refusal is not None:
            raise IngestFailedError(self.refusal)

    def _sync(self, position: Any) -> None:
        """Wait until the batch's log entry is on disk, or committed to the fleet log
        (outside the lock: group commit)."""
        try:
            if self.fleet is not None and position is not None:
                self.fleet.sync(position)
            elif position is not None and self.wal is not None:
                self.wal.sync(position)
        except WalError as exc:
            raise IngestFailedError(str(exc)) from exc

    def count_rejected(self, protocol: str, num_bytes: int = 0) -> None:
        """Count a request refused before reaching :meth:`apply` (undecodable, too large)."""
        with self._lock:
            self._count(protocol, "rejected", num_bytes)

    def count_spans(self, *, mapped: int, ignored: int, rejected: int) -> None:
        with self._lock:
            spans = self._counts.spans
            spans["mapped"] += mapped
            spans["ignored"] += ignored
            spans["rejected"] += rejected

    def collect(self) -> Iterator[Metric]:
        """Prometheus families of the counters (see :class:`IngestCollector`)."""
        with self._lock:
            counts = self._counts
            batches = dict(counts.batches)
            per_protocol = (
                dict(counts.records),
                dict(counts.rejected_records),
                dict(counts.tokens),
                dict(counts.bytes),
            )
            spans = dict(counts.spans)
            dedup = self.dedup.stats()
        family = CounterMetricFamily(
            "goodput_ingest_batches",
            "Batches received by protocol and outcome.",
            labels=["protocol", "outcome"],
        )
        for (protocol, outcome), value in batches.items():
            family.add_metric([protocol, outcome], value)
        yield family
        for (name, doc), values in zip(
            (
                ("goodput_ingest_records", "Request records applied to the goodput engine."),
                (
                    "goodput_ingest_rejected_records",
                    "Records of accepted batches refused one by one (out of the engine's range).",
                ),
                ("goodput_ingest_tokens", "Output tokens (token timestamps) applied."),
                ("goodput_ingest_received_bytes", "Request body bytes received."),
            ),
            per_protocol,
            strict=True,
        ):
            counter = CounterMetricFamily(name, doc, labels=["protocol"])
            for protocol, value in values.items():
                counter.add_metric([protocol], value)
            yield counter
        span_family = CounterMetricFamily(
            "goodput_ingest_otlp_spans",
            "OTLP spans received: mapped to records, ignored (not llm_request), rejected.",
            labels=["outcome"],
        )
        for outcome, value in spans.items():
            span_family.add_metric([outcome], value)
        yield span_family
        yield GaugeMetricFamily(
            "goodput_ingest_dedup_exporters",
            "Exporters whose batch sequence the receiver tracks for de-duplication.",
            value=dedup.num_exporters,
        )
        yield CounterMetricFamily(
            "goodput_ingest_dedup_evicted",
            "Exporters evicted from de-duplication tracking (least recently seen first).",
            value=dedup.num_evicted,
        )

    # -- internals (lock held) ----------------------------------------------------------

    def _ingest(
        self,
        batch: RecordBatch,
        protocol: str,
        num_bytes: int,
        validated: bool,
        header: BatchHeader | None,
        *,
        body: tuple[bytes, str] | None,
    ) -> tuple[IngestOutcome, Any]:
        position: Any = None
        try:
            if not validated:
                batch.validate()  # the screen reads the batch's shape: check it first
            now = self.engine.now()
            screened = screen(batch, now)
            if self.fleet is not None:  # logged for every replica's reader to count
                position = self.fleet.append(
                    log_entry(screened, header, body), screened.max_finish_minute, screened.batch
                )
                self._count(protocol, "applied", num_bytes)
                self._counts.rejected_records[protocol] += len(screened.rejections)
                return self._outcome(screened.batch, header, screened.rejections), position
            if self.wal is not None:  # written ahead: a batch in the engine is in the log
                position = self.wal.append(
                    log_entry(screened, header, body), screened.max_finish_minute
                )
            batch = screened.batch
            # The same clock reading as the screen: what it took, the engine counts.
            self.engine.ingest(batch, validate=False, now=now)
        except WalError as exc:
            self._count(protocol, "failed", num_bytes)
            raise IngestFailedError(str(exc)) from exc
        except Exception as exc:
            self._count(protocol, "failed", num_bytes)
            if position is not None and self.wal is not None:
                with contextlib.suppress(WalError):  # logged, not applied: replay skips it
                    self.wal.append(VOID_ENTRY, -1)
            logger.exception(
                "goodput engine failed on a %s batch of %d records", protocol, len(batch)
            )
            raise IngestFailedError(
                f"the goodput engine failed on this batch ({type(exc).__name__}); "
                "nothing was marked applied, retry later"
            ) from exc
        num_tokens = self._after_apply(batch, protocol, header.exporter_id if header else "")
        self._count(protocol, "applied", num_bytes)
        self._counts.rejected_records[protocol] += len(screened.rejections)
        return self._outcome(batch, header, screened.rejections, num_tokens), position

    def _after_apply(self, batch: RecordBatch, protocol: str, source: str) -> int:
        """Tell the listeners and count what the engine just took; its output tokens."""
        for listener in self._listeners:
            try:
                listener(batch, source)
            except Exception:  # a control loop's bug must not fail ingest
                self.listener_failures += 1
                logger.exception("ingest listener %r failed", listener)
        num_tokens = int(batch.emission_tokens.sum(dtype=np.int64))
        self._counts.records[protocol] += len(batch)
        self._counts.tokens[protocol] += num_tokens
        return num_tokens

    @staticmethod
    def _outcome(
        batch: RecordBatch,
        header: BatchHeader | None,
        rejections: tuple[RecordRejection, ...],
        num_tokens: int | None = None,
    ) -> IngestOutcome:
        return IngestOutcome(
            duplicate=False,
            exporter_id=header.exporter_id if header else "",
            seq=header.seq if header else 0,
            num_records=len(batch),
            num_final=int(np.count_nonzero(batch.final)),
            num_emissions=batch.num_emissions,
            num_tokens=(
                int(batch.emission_tokens.sum(dtype=np.int64)) if num_tokens is None else num_tokens
            ),
            rejections=rejections,
        )

    def _count(self, protocol: str, outcome: str, num_bytes: int) -> None:
        self._counts.batches[(protocol, outcome)] += 1
        self._counts.bytes[protocol] += num_bytes

    def _warn_stale(self, exporter_id: str, seq: int, high: int | None) -> None:
        if exporter_id in self._warned_stale or len(self._warned_stale) >= 1000:
            return  # de-duplicated: once per exporter, bounded
        self._warned_stale.add(exporter_id)
        logger.warning(
            "refusing stale batch seq=%d of exporter %r (highest applied %s): the exporter "
            "probably restarted under the same exporter_id",
            seq,
            exporter_id,
            high,
        )


def check_tenant(batch: RecordBatch, tenant: str | None) -> None:
    """Raise :class:`TenantScopeError` unless every record's ``tenant`` label is ``tenant``
    (no check when ``tenant`` is ``None``). One vectorised compare on the codes."""
    if tenant is None or not len(batch):
        return
    column = batch.labels["tenant"]
    used = [column.values[c] for c in np.unique(column.codes).tolist()]
    others = [value for value in used if value != tenant]
    if others:
        raise TenantScopeError(
            f"labels.tenant: this key is scoped to tenant {tenant!r}; the batch has records "
            f"labelled {others[0]!r}"
        )


class IngestCollector:
    """A Prometheus collector over an :class:`Ingestor`'s counters (read at scrape time)."""

    def __init__(self, ingestor: Ingestor) -> None:
        self._ingestor = ingestor

    def collect(self) -> Iterator[Metric]:
        return self._ingestor.collect()
