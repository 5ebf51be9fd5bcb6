"""Pending records folded into metrics in batches: the queue the Prometheus and OpenTelemetry
exporters share.

:meth:`RecordFolder.export` appends a final record (an append under a lock: no per-record
metric work); once ``fold_every`` records wait, or the oldest has waited ``max_delay_s``,
or a reader asks (:meth:`RecordFolder.fold`: a scrape, a collection, ``force_flush``), the
pending records are validated as one batch (:func:`~exporters._valid_batch.valid_batch`) and
handed to ``apply``. Folds run one at a time under :attr:`RecordFolder.lock`, which a reader
holds to see a consistent state. A fold never raises: telemetry must not break serving or a
scrape.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from exporters._valid_batch import InvalidRecordLog, valid_batch
from exporters.records import RecordBatch, RequestRecord

__all__ = ["FoldingSink", "RecordFolder"]


class RecordFolder:
    """Final records queued and folded by ``apply`` in batches (see the module docstring);
    ``destination`` names the metrics in log lines."""

    def __init__(
        self,
        apply: Callable[[RecordBatch], None],
        *,
        destination: str,
        logger: logging.Logger,
        fold_every: int,
        max_delay_s: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fold_every < 1:
            raise ValueError(f"fold_every must be >= 1, got {fold_every}")
        if not max_delay_s >= 0:
            raise ValueError(f"max_delay_s must be >= 0, got {max_delay_s}")
        self.fold_every = fold_every
        self.max_delay_s = max_delay_s
        self.lock = threading.Lock()  # one fold at a time; readers hold it too
        self._apply = apply
        self._destination = destination
        self._logger = logger
        self._clock = clock
        self._pending_lock = threading.Lock()  # guards the queue, held for an append
        self._pending: list[RequestRecord] = []
        self._oldest = 0.0
        self._closed = False
        self._invalid = InvalidRecordLog(destination, logger)

    @property
    def num_invalid_records(self) -> int:
        """Records left out because they did not validate (the first one is logged)."""
        return self._invalid.count

    def export(self, record: RequestRecord) -> None:
        """Queue ``record`` when it is final (a request counts once, when it ends)."""
        if not record.final:
            return
        now = self._clock()
        with self._pending_lock:
            if self._closed:
                return
            if not self._pending:
                self._oldest = now
            self._pending.append(record)
            due = len(self._pending) >= self.fold_every or now - self._oldest >= self.max_delay_s
        if due:
            self.fold()

    def fold(self) -> None:
        """Fold what is pending now. Never raises."""
        try:
            with self.lock:
                with self._pending_lock:
                    records, self._pending = self._pending, []
                if not records:
                    return
                batch = valid_batch(records, self._invalid)
                if len(batch):
                    self._apply(batch)
        except Exception:
            self._logger.exception("folding request records into %s failed", self._destination)

    def close(self) -> None:
        """Stop accepting records and fold what is pending."""
        with self._pending_lock:
            self._closed = True
        self.fold()


class FoldingSink:
    """The :class:`~exporters.sinks.RecordSink` side of an exporter whose records go through
    a :class:`RecordFolder` (``self._folder``, made by the subclass)."""

    _folder: RecordFolder

    def export(self, record: RequestRecord) -> None:
        self._folder.export(record)

    @property
    def fold_every(self) -> int:
        return self._folder.fold_every

    @property
    def max_delay_s(self) -> float:
        return self._folder.max_delay_s

    @property
    def num_invalid_records(self) -> int:
        """Records left out because they did not validate (the first one is logged)."""
        return self._folder.num_invalid_records

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        self._folder.fold()
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Fold what is pending and stop accepting records; what was folded stays readable."""
        self._folder.close()
