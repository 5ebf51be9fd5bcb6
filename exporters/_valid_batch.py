"""One batch of the records that validate, for exporters that fold records into metrics.

The Prometheus and OpenTelemetry exporters take records from serving code they do not
control; a malformed record must not cost the well-formed ones beside it their metrics.
:func:`valid_batch` validates the whole batch at once (the common case) and only when that
fails looks for the culprits one by one, handing each to ``on_invalid``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from exporters.records import RecordBatch, RecordError, RequestRecord

__all__ = ["InvalidRecordLog", "valid_batch"]


def valid_batch(
    records: Sequence[RequestRecord], on_invalid: Callable[[RequestRecord, Exception], None]
) -> RecordBatch:
    """The records of ``records`` that validate, as one batch; ``on_invalid`` gets the rest."""
    batch = RecordBatch.from_records(records)
    try:
        batch.validate()
    except RecordError:
        return _valid_ones(records, on_invalid)
    return batch


def _valid_ones(
    records: Sequence[RequestRecord], on_invalid: Callable[[RequestRecord, Exception], None]
) -> RecordBatch:
    good = []
    for record in records:  # rare: find the culprits one by one
        try:
            RecordBatch.from_records([record]).validate()
        except (RecordError, ValueError) as exc:
            on_invalid(record, exc)
        else:
            good.append(record)
    return RecordBatch.from_records(good)


class InvalidRecordLog:
    """Counts the records an exporter leaves out and logs the first one (then only counts,
    so a client sending garbage cannot flood the log)."""

    def __init__(self, destination: str, logger: logging.Logger) -> None:
        self.count = 0
        self._destination = destination
        self._logger = logger

    def __call__(self, record: RequestRecord, exc: Exception) -> None:
        self.count += 1
        if self.count == 1:
            self._logger.error(
                "record %r left out of %s (%s); further ones are counted only",
                record.request_id,
                self._destination,
                exc,
            )
