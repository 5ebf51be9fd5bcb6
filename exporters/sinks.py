"""Where finished request records go: the :class:`RecordSink` seam and its combinators.

A sink receives every record a :class:`~exporters.recorder.RequestRecorder` finishes. It is
called on the serving path (once per request, never per token), so ``export`` must be cheap
and must never raise: a sink buffers, drops and counts, it does not fail the request. The
shape follows OpenTelemetry's ``SpanExporter``/``SpanProcessor``: ``force_flush`` pushes
what is buffered within a timeout and says whether it all went, ``shutdown`` is idempotent.

Example::

    sink = FanoutSink(PrometheusExporter(registry), ControlPlaneExporter(url))
    recorder = RequestRecorder(Vantage.GATEWAY, sink)
    ...
    sink.shutdown(timeout_s=5.0)
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol, runtime_checkable

from exporters.records import RequestRecord

__all__ = ["FanoutSink", "InMemorySink", "RecordSink"]

logger = logging.getLogger(__name__)


@runtime_checkable
class RecordSink(Protocol):
    """Receives finished (and partial) request records.

    * ``export(record)``: hand one record over. Cheap (no I/O on the caller's thread) and
      never raises; what cannot be kept is dropped and counted by the sink.
    * ``force_flush(timeout_s)``: deliver what is buffered; ``True`` when all of it went
      within the timeout.
    * ``shutdown(timeout_s)``: flush what it can, release resources; idempotent. Records
      exported after shutdown are dropped (and counted where the sink counts).
    """

    def export(self, record: RequestRecord) -> None: ...

    def force_flush(self, timeout_s: float = 10.0) -> bool: ...

    def shutdown(self, timeout_s: float = 10.0) -> None: ...


class FanoutSink:
    """Sends every record to each of several sinks, in order.

    One sink raising (which a sink should never do) neither stops the others nor reaches the
    caller: the failure is logged once per sink and counted in :attr:`num_errors`.
    ``force_flush`` and ``shutdown`` share the one deadline among the sinks.
    """

    def __init__(self, *sinks: RecordSink) -> None:
        self._sinks = sinks
        self._failed: set[int] = set()
        self._closed = False
        self.num_errors = 0

    @property
    def sinks(self) -> tuple[RecordSink, ...]:
        return self._sinks

    def export(self, record: RequestRecord) -> None:
        for i, sink in enumerate(self._sinks):
            try:
                sink.export(record)
            except Exception:
                self._on_error(i, sink, "export")

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        ok = True
        for i, sink in enumerate(self._sinks):
            try:
                ok = sink.force_flush(max(0.0, deadline - time.monotonic())) and ok
            except Exception:
                self._on_error(i, sink, "force_flush")
                ok = False
        return ok

    def shutdown(self, timeout_s: float = 10.0) -> None:
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        for i, sink in enumerate(self._sinks):
            try:
                sink.shutdown(max(0.0, deadline - time.monotonic()))
            except Exception:
                self._on_error(i, sink, "shutdown")

    def _on_error(self, index: int, sink: RecordSink, what: str) -> None:
        self.num_errors += 1
        if index not in self._failed:  # de-duplicated: a broken sink fails on every record
            self._failed.add(index)
            logger.exception(
                "record sink %r failed in %s; further failures are counted only", sink, what
            )


class InMemorySink:
    """Keeps every record in a list: for tests and for embedding (like OTel's
    ``InMemorySpanExporter``). Thread-safe; records exported after shutdown are dropped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []
        self._closed = False
        self.num_dropped = 0

    @property
    def records(self) -> list[RequestRecord]:
        """A copy of the records received so far, in order."""
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

    def export(self, record: RequestRecord) -> None:
        with self._lock:
            if self._closed:
                self.num_dropped += 1
            else:
                self._records.append(record)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        with self._lock:
            self._closed = True
