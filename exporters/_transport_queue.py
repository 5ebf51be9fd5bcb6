"""The control-plane exporter's outbound buffer and retry schedule.

Private: used by :mod:`exporters.transport`, which owns the locking (only its worker
thread mutates these; readers take the exporter's lock).
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx

from exporters.records import RequestRecord

__all__ = [
    "Backoff",
    "EncodedBatch",
    "OutboundQueue",
    "refused_records",
    "retry_after_s",
    "split_batches",
]

# Upper bounds on the encoded size, for splitting before encoding: per record (id, labels,
# per-record columns) and per emission (an int64 delta and an int32 token count).
RECORD_BYTES_BOUND = 256
EMISSION_BYTES_BOUND = 12


def split_batches(
    records: list[RequestRecord], max_records: int, max_bytes: int
) -> Iterator[list[RequestRecord]]:
    """Consecutive runs of ``records`` of at most ``max_records`` records and about
    ``max_bytes`` encoded bytes (estimated from above; a single larger record goes alone),
    so that a batch of long requests stays under the control plane's size limit.
    """
    run: list[RequestRecord] = []
    size = 0
    for record in records:
        num_emissions = int(record.emission_offsets_us.shape[0])
        cost = RECORD_BYTES_BOUND + len(record.request_id) + len(record.reason)
        cost += EMISSION_BYTES_BOUND * num_emissions
        if run and (len(run) >= max_records or size + cost > max_bytes):
            yield run
            run, size = [], 0
        run.append(record)
        size += cost
    if run:
        yield run


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """One encoded batch, resent byte for byte (same ``seq``) until acknowledged."""

    seq: int
    data: bytes
    num_records: int


class OutboundQueue:
    """Encoded batches in sequence order, bounded by their total size in bytes.

    :meth:`push` makes room by dropping the *oldest* batches (the newest data is the most
    useful to a control loop) and returns what it dropped so the caller can count it. A
    batch larger than the whole bound is dropped itself.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_buffer_bytes must be >= 1, got {max_bytes}")
        self.max_bytes = max_bytes
        self._batches: deque[EncodedBatch] = deque()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._batches)

    def push(self, batch: EncodedBatch) -> list[EncodedBatch]:
        if len(batch.data) > self.max_bytes:
            return [batch]
        dropped: list[EncodedBatch] = []
        while self._batches and self.num_bytes + len(batch.data) > self.max_bytes:
            dropped.append(self.pop())
        self._batches.append(batch)
        self.num_bytes += len(batch.data)
        return dropped

    def peek(self) -> EncodedBatch:
        return self._batches[0]

    def pop(self) -> EncodedBatch:
        batch = self._batches.popleft()
        self.num_bytes -= len(batch.data)
        return batch

    def clear(self) -> list[EncodedBatch]:
        batches = list(self._batches)
        self._batches.clear()
        self.num_bytes = 0
        return batches


class Backoff:
    """Capped exponential backoff with jitter: attempt *k* waits a uniform draw from
    ``[d/2, d]`` with ``d = min(max_s, initial_s * 2**k)``. The jitter spreads the retries
    of a fleet of exporters after the control plane comes back; the floor of ``d/2`` keeps
    each exporter from hammering it.
    """

    def __init__(
        self, initial_s: float, max_s: float, rand: Callable[[], float] = random.random
    ) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(
                f"backoff must satisfy 0 < backoff_initial_s <= backoff_max_s, "
                f"got {initial_s} and {max_s}"
            )
        self.initial_s = initial_s
        self.max_s = max_s
        self._rand = rand
        self.attempt = 0

    def next_delay_s(self, retry_after_s: float | None = None) -> float:
        """The wait before the next attempt; a server's ``Retry-After`` lengthens it (capped)."""
        ceiling = min(self.max_s, self.initial_s * 2.0 ** min(self.attempt, 60))
        self.attempt += 1
        delay = ceiling * (0.5 + 0.5 * self._rand())
        if retry_after_s is not None and retry_after_s > delay:
            delay = min(retry_after_s, self.max_s)
        return delay

    def reset(self) -> None:
        self.attempt = 0


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header; ``None`` when absent, negative or an HTTP date
    (rare from an API: the backoff applies)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def refused_records(response: httpx.Response) -> int:
    """How many records of an acknowledged batch the receiver refused one by one: the
    ``num_rejected`` of its JSON answer (0 when absent or unreadable: a receiver that
    lists nothing took every record)."""
    try:
        body = json.loads(response.content)
    except (ValueError, TypeError):
        return 0
    value = body.get("num_rejected", 0) if isinstance(body, dict) else 0
    return value if type(value) is int and value > 0 else 0
