"""Ship request records to the control plane: batched, buffered, retried, counted.

:class:`ControlPlaneExporter` is a :class:`~exporters.sinks.RecordSink`. ``export`` appends
the record to a queue and returns (a lock held for an append, per request). One background
thread does the rest, so the host — an asyncio server, a vLLM plugin or a script — is never
blocked and its event loop never touched:

* every ``flush_interval_s`` or ``max_batch_records`` records, it encodes the queued
  records with :func:`exporters.wire.encode_batch` under the next sequence number of this
  exporter (``seq`` 0, 1, 2, …; ``exporter_id`` fixed for the exporter's life), in batches
  of at most ``max_batch_records`` records and about ``max_batch_bytes`` (below the
  control plane's 16 MiB limit even for requests of tens of thousands of tokens);
* it POSTs each batch to ``{url}/api/v1/ingest`` (``Content-Type``
  :data:`~exporters.wire.CONTENT_TYPE_BINARY`, ``Authorization: Bearer <key>`` when a key
  is given) with a timeout, in sequence order;
* 2xx: delivered. The receiver may list records it refused one by one (out of the
  engine's range: ``docs/ingest.md``); those are counted as rejected, the rest as
  exported, and the batch is done. Unreachable, timeout, 5xx or 429: the batch stays,
  byte for byte under the same ``seq``, and is retried after a capped exponential
  backoff with jitter (``Retry-After`` honoured up to the cap); the receiver's de-duplication on
  ``(exporter_id, seq)`` makes delivery exactly-once. Any other status (a 4xx but 429)
  means the batch is bad: it is dropped, counted as rejected and logged once per status;
* encoded batches wait in a buffer bounded in bytes (``max_buffer_bytes``); when it is
  full the *oldest* batches are dropped and their records and bytes counted. Records not
  yet encoded are bounded too (``max_queue_records``, oldest dropped and counted).

Counters are in :meth:`stats` and, with a ``registry``, in Prometheus as
``goodput_exporter_*`` (see :mod:`exporters._transport_stats`).

Example::

    exporter = ControlPlaneExporter("http://controlplane:8000", api_key=key,
                                    registry=registry)
    recorder = RequestRecorder(Vantage.GATEWAY, exporter)
    ...
    exporter.shutdown(timeout_s=5.0)
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import uuid
from collections import deque

import httpx
from prometheus_client import CollectorRegistry

from exporters._transport_queue import (
    Backoff,
    EncodedBatch,
    OutboundQueue,
    refused_records,
    retry_after_s,
    split_batches,
)
from exporters._transport_stats import ControlPlaneExporterStats, ExporterStatsCollector
from exporters.records import RecordBatch, RequestRecord
from exporters.wire import CONTENT_TYPE_BINARY, encode_batch

__all__ = ["INGEST_PATH", "ControlPlaneExporter", "ControlPlaneExporterStats"]

logger = logging.getLogger(__name__)

INGEST_PATH = "/api/v1/ingest"


class ControlPlaneExporter:
    """A :class:`~exporters.sinks.RecordSink` that delivers records to the control plane.

    ``transport`` replaces httpx's network transport (TLS settings, a mock in tests).
    Unless ``exit_timeout_s`` is ``None``, an exporter still open at interpreter exit is
    shut down then, flushing for at most that long.
    ``force_flush(timeout_s)`` sends at once (skipping a backoff wait) and returns ``True``
    once every record exported before the call has left the exporter — delivered, or
    dropped/rejected and counted — or ``False`` at the timeout. ``shutdown`` is
    idempotent: it stops accepting records, flushes what it can within the timeout, then
    counts what is left as dropped and stops the worker.
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        exporter_id: str | None = None,
        max_batch_records: int = 512,
        max_batch_bytes: int = 4 * 1024 * 1024,
        flush_interval_s: float = 0.25,
        max_buffer_bytes: int = 16 * 1024 * 1024,
        max_queue_records: int = 65_536,
        timeout_s: float = 5.0,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
        registry: CollectorRegistry | None = None,
        transport: httpx.BaseTransport | None = None,
        exit_timeout_s: float | None = 2.0,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        for name, value in (
            ("max_batch_records", max_batch_records),
            ("max_batch_bytes", max_batch_bytes),
            ("max_queue_records", max_queue_records),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name, seconds in (("flush_interval_s", flush_interval_s), ("timeout_s", timeout_s)):
            if not seconds > 0:
                raise ValueError(f"{name} must be > 0, got {seconds}")
        self.url = url.rstrip("/") + INGEST_PATH
        self.exporter_id = exporter_id or uuid.uuid4().hex
        self.max_batch_records = max_batch_records
        self.max_batch_bytes = max_batch_bytes
        self.flush_interval_s = flush_interval_s
        self.max_queue_records = max_queue_records
        self.timeout_s = timeout_s
        self._backoff = Backoff(backoff_initial_s, backoff_max_s)
        self._outbound = OutboundQueue(max_buffer_bytes)
        headers = {"Content-Type": CONTENT_TYPE_BINARY}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(headers=headers, timeout=timeout_s, transport=transport)

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: deque[RequestRecord] = deque()
        self._seq = 0  # the next batch's sequence number; only the worker advances it
        self._flush_gen = 0  # force_flush calls so far
        self._served_gen = 0  # the latest call whose records are all encoded ...
        self._served_boundary = 0  # ... into batches with seq below this
        self._closed = False  # no new records
        self._stopping = False  # the worker exits at its next check
        self._deadline: float | None = None  # shutdown's deadline caps request timeouts
        self._retry_at = 0.0
        self._failing = False
        self._logged_statuses: set[int] = set()
        self._logged_encode_error = False
        self._logged_refusal = False
        self._num_exported = 0
        self._num_dropped = 0
        self._num_dropped_bytes = 0
        self._num_rejected = 0
        self._num_rejected_batches = 0
        self._num_sent_batches = 0
        self._num_retries = 0

        if registry is not None:  # first: a registry refusing it leaves nothing running
            registry.register(ExporterStatsCollector(self.stats))
        self._worker = threading.Thread(
            target=self._run, name=f"goodput-exporter-{self.exporter_id[:8]}", daemon=True
        )
        self._worker.start()
        self.exit_timeout_s = exit_timeout_s
        if exit_timeout_s is not None:  # like the OTel SDK's providers: flush at exit
            atexit.register(self._shutdown_at_exit)

    # -- RecordSink --

    def export(self, record: RequestRecord) -> None:
        with self._lock:
            if self._closed:
                self._num_dropped += 1
                return
            if len(self._pending) >= self.max_queue_records:
                self._pending.popleft()
                self._num_dropped += 1
            self._pending.append(record)
            # Wake the worker on the first record (an idle worker sleeps with no timer, so
            # this starts the flush-interval clock) and on a full batch; never per record.
            if len(self._pending) in (1, self.max_batch_records):
                self._cond.notify_all()

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._flush_gen += 1
            gen = self._flush_gen
            self._cond.notify_all()
            while not self._flushed(gen):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._worker.is_alive():
                    return False
                self._cond.wait(remaining)
            return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        end = time.monotonic() + timeout_s
        # Keep a little of the time for the worker to stop and count what is left.
        flush_end = end - min(0.05, 0.1 * timeout_s)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._deadline = flush_end  # caps the timeout of the requests still to come
        if self.exit_timeout_s is not None:
            atexit.unregister(self._shutdown_at_exit)
        self.force_flush(max(0.0, flush_end - time.monotonic()))
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        # The worker counts what is left as dropped and closes the client as it exits.
        self._worker.join(max(0.0, end - time.monotonic()))

    def _shutdown_at_exit(self) -> None:
        self.shutdown(self.exit_timeout_s or 0.0)

    def stats(self) -> ControlPlaneExporterStats:
        with self._lock:
            return ControlPlaneExporterStats(
                exporter_id=self.exporter_id,
                num_exported_records=self._num_exported,
                num_dropped_records=self._num_dropped,
                num_dropped_bytes=self._num_dropped_bytes,
                num_rejected_records=self._num_rejected,
                num_rejected_batches=self._num_rejected_batches,
                num_sent_batches=self._num_sent_batches,
                num_retries=self._num_retries,
                num_pending_records=len(self._pending),
                num_buffered_batches=len(self._outbound),
                buffer_bytes=self._outbound.num_bytes,
            )

    # -- the worker thread --

    def _flushed(self, gen: int) -> bool:
        """Lock held: have the records exported before flush call ``gen`` all left?"""
        if self._served_gen < gen:
            return False  # the worker has not encoded them yet
        # Batches leave in seq order, so every batch below the boundary has left once the
        # oldest one still buffered is at or past it.
        return not len(self._outbound) or self._outbound.peek().seq >= self._served_boundary

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_interval_s
        while True:
            with self._cond:
                flush_gen = self._wait_for_work(next_flush)
                if self._stopping:
                    break
                records = list(self._pending)
                self._pending.clear()
            try:
                if records:
                    self._encode(records)
                if flush_gen:
                    with self._lock:
                        self._served_gen = flush_gen
                        self._served_boundary = self._seq
                next_flush = time.monotonic() + self.flush_interval_s
                self._send_due(force=bool(flush_gen))
            except Exception:  # a bug here must not kill delivery for the process
                logger.exception("control-plane exporter worker failed; continuing")
                time.sleep(min(1.0, self.flush_interval_s))
            with self._cond:
                self._cond.notify_all()  # wake force_flush callers to re-check
        self._drop_leftovers()

    def _wait_for_work(self, next_flush: float) -> int:
        """Block (lock held) until there is work; the flush generation to serve, or 0."""
        while True:
            if self._stopping:
                return 0
            if self._flush_gen > self._served_gen:
                return self._flush_gen
            now = time.monotonic()
            if len(self._pending) >= self.max_batch_records:
                return 0
            if self._pending and now >= next_flush:
                return 0
            if len(self._outbound) and now >= self._retry_at:
                return 0
            wake = next_flush if self._pending else float("inf")
            if len(self._outbound):
                wake = min(wake, self._retry_at)
            self._cond.wait(None if wake == float("inf") else max(0.0, wake - now))

    def _encode(self, records: list[RequestRecord]) -> None:
        for chunk in split_batches(records, self.max_batch_records, self.max_batch_bytes):
            data, num_records = self._encode_chunk(chunk)
            if data is None:
                continue
            with self._lock:
                batch = EncodedBatch(self._seq, data, num_records)
                self._seq += 1
                for old in self._outbound.push(batch):
                    self._num_dropped += old.num_records
                    self._num_dropped_bytes += len(old.data)

    def _encode_chunk(self, chunk: list[RequestRecord]) -> tuple[bytes | None, int]:
        """Encode ``chunk`` under the next seq; records that break the contract are left out
        and counted as rejected (found one by one only when the whole chunk fails)."""
        seq = self._seq  # only this thread advances it
        try:
            return self._encode_records(chunk, seq), len(chunk)
        except Exception:  # WireError/RecordError, or a record of the wrong shape
            pass
        good: list[RequestRecord] = []
        for record in chunk:
            try:
                self._encode_records([record], seq)
            except Exception as exc:
                self._reject_record(record, exc)
            else:
                good.append(record)
        if not good:
            return None, 0
        try:
            return self._encode_records(good, seq), len(good)
        except Exception as exc:
            for record in good:
                self._reject_record(record, exc)
            return None, 0

    def _encode_records(self, records: list[RequestRecord], seq: int) -> bytes:
        batch = RecordBatch.from_records(records)
        return encode_batch(batch, exporter_id=self.exporter_id, seq=seq)

    def _reject_record(self, record: RequestRecord, exc: Exception) -> None:
        with self._lock:
            self._num_rejected += 1
            first = not self._logged_encode_error
            self._logged_encode_error = True
        if first:
            logger.error(
                "dropping record %r that cannot be encoded (%s); further ones are counted only",
                record.request_id,
                exc,
            )

    def _send_due(self, force: bool) -> None:
        """Send buffered batches in order until the buffer is empty or an attempt fails."""
        while True:
            with self._lock:
                if not len(self._outbound) or self._stopping:
                    return
                if not force and time.monotonic() < self._retry_at:
                    return
                batch = self._outbound.peek()
            force = False
            outcome, refused = self._post(batch)
            with self._lock:
                if outcome == "retry":
                    return
                self._outbound.pop()
                if outcome == "sent":
                    self._num_exported += batch.num_records - refused
                    self._num_rejected += refused
                    self._num_sent_batches += 1
                else:
                    self._num_rejected += batch.num_records
                    self._num_rejected_batches += 1

    def _post(self, batch: EncodedBatch) -> tuple[str, int]:
        """One attempt: ``"sent"``, ``"rejected"`` or ``"retry"`` (the retry time is set),
        and how many records of a sent batch the receiver refused one by one."""
        timeout = self.timeout_s
        if self._deadline is not None:
            timeout = max(0.01, min(timeout, self._deadline - time.monotonic()))
        retry_after: float | None = None
        try:
            response = self._client.post(self.url, content=batch.data, timeout=timeout)
        except Exception as exc:  # httpx.HTTPError mostly; whatever it is, retry later
            problem = f"{type(exc).__name__}: {exc}"
        else:
            status = response.status_code
            if 200 <= status < 300:
                return "sent", self._on_delivered(batch, response)
            if status != 429 and not 500 <= status < 600:
                self._on_rejected(batch, response)
                return "rejected", 0
            problem = f"HTTP {status}"
            retry_after = retry_after_s(response.headers.get("Retry-After"))
        delay = self._backoff.next_delay_s(retry_after)
        with self._lock:
            self._num_retries += 1
            self._retry_at = time.monotonic() + delay
            first = not self._failing
            self._failing = True
        if first:  # de-duplicated: logged when failures start and when they end
            logger.warning(
                "control plane at %s unavailable (%s); buffering and retrying (next in %.2fs)",
                self.url,
                problem,
                delay,
            )
        return "retry", 0

    def _on_delivered(self, batch: EncodedBatch, response: httpx.Response) -> int:
        refused = refused_records(response)
        if refused:
            with self._lock:
                first = not self._logged_refusal
                self._logged_refusal = True
            if first:  # once: the counter says how many follow
                logger.error(
                    "control plane took batch seq=%d but refused %d of its %d records "
                    "(%s); they are counted as rejected, further ones only counted",
                    batch.seq,
                    refused,
                    batch.num_records,
                    response.text[:500],
                )
        self._backoff.reset()
        with self._lock:
            recovered = self._failing
            self._failing = False
            self._retry_at = 0.0
        if recovered:
            logger.warning("control plane at %s reachable again; delivering", self.url)
        return refused

    def _on_rejected(self, batch: EncodedBatch, response: httpx.Response) -> None:
        status = response.status_code
        with self._lock:
            first = status not in self._logged_statuses
            self._logged_statuses.add(status)
        if first:  # de-duplicated per status code
            logger.error(
                "control plane rejected batch seq=%d (%d records) with HTTP %d: %s; dropping "
                "it (further HTTP %d rejections are counted only)",
                batch.seq,
                batch.num_records,
                status,
                response.text[:500],
                status,
            )

    def _drop_leftovers(self) -> None:
        with self._lock:
            for batch in self._outbound.clear():
                self._num_dropped += batch.num_records
                self._num_dropped_bytes += len(batch.data)
            self._num_dropped += len(self._pending)
            self._pending.clear()
            self._cond.notify_all()
        self._client.close()
