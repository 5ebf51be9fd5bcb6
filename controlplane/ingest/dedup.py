"""De-duplication of record batches by ``(exporter_id, seq)``: bounded, per exporter.

The wire contract (:class:`exporters.wire.BatchHeader`) numbers each exporter's batches
0, 1, 2, … and resends a batch under the same ``seq`` until it is acknowledged. The
transport sends in order and resends only its oldest unacknowledged batch, so a duplicate
is always close behind the highest ``seq`` seen. Per exporter we keep that *high-water mark*
and a bitmap of the ``window`` sequence numbers at or below it:

* ``seq`` above the mark: new (the mark moves up, the bitmap shifts);
* ``seq`` within the window: new unless its bit is set (then a duplicate);
* ``seq`` at or below ``mark − window``: *stale*. An in-order sender cannot produce it (its
  later batches wait for this one's acknowledgement); it means a sender that restarted
  under the same ``exporter_id`` (the contract says an id lives as long as its exporter) or
  a broken one. It is reported apart, so the receiver can refuse it loudly rather than
  guess.

Limits: ``window`` bits per exporter (128 bytes at the default 1024), at most
``max_exporters`` exporters kept, least recently seen evicted first (a duplicate from an
evicted exporter is then accepted again). The state survives a restart through the
write-ahead log's checkpoint (:meth:`Deduplicator.snapshot` / :meth:`~Deduplicator.restore`)
and the replay of the batches logged since.

Example::

    dedup = Deduplicator(window=1024)
    assert dedup.check("gw-0", 7) is SeqVerdict.NEW
    dedup.mark("gw-0", 7)
    assert dedup.check("gw-0", 7) is SeqVerdict.DUPLICATE
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum

import msgpack

__all__ = ["DEFAULT_MAX_EXPORTERS", "DEFAULT_WINDOW", "DedupStats", "Deduplicator", "SeqVerdict"]

DEFAULT_WINDOW = 1024
DEFAULT_MAX_EXPORTERS = 100_000


class SeqVerdict(StrEnum):
    """What a batch's ``(exporter_id, seq)`` means to the receiver."""

    NEW = "new"
    DUPLICATE = "duplicate"
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class DedupStats:
    """``num_exporters`` tracked now; ``num_evicted`` dropped to stay within the bound."""

    num_exporters: int
    num_evicted: int


class _Exporter:
    """Bit ``i`` of ``seen`` set: ``high - i`` was applied (``0 <= i < window``)."""

    __slots__ = ("high", "seen")

    def __init__(self, seq: int) -> None:
        self.high = seq
        self.seen = 0


class Deduplicator:
    """Remembers applied ``(exporter_id, seq)`` pairs within a bounded window (module doc).

    Not thread-safe: the caller serialises :meth:`check` + apply + :meth:`mark` (the
    :class:`~controlplane.ingest.ingestor.Ingestor` holds one lock around the three), so a
    batch is marked only once it was applied.
    """

    def __init__(
        self, window: int = DEFAULT_WINDOW, max_exporters: int = DEFAULT_MAX_EXPORTERS
    ) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        if isinstance(max_exporters, bool) or not isinstance(max_exporters, int):
            raise ValueError(f"max_exporters must be an integer >= 1, got {max_exporters!r}")
        if max_exporters < 1:
            raise ValueError(f"max_exporters must be an integer >= 1, got {max_exporters!r}")
        self.window = window
        self.max_exporters = max_exporters
        self._mask = (1 << window) - 1
        self._exporters: OrderedDict[str, _Exporter] = OrderedDict()
        self._num_evicted = 0

    def check(self, exporter_id: str, seq: int) -> SeqVerdict:
        """Whether ``seq`` of ``exporter_id`` is new, a duplicate, or stale (no change)."""
        state = self._exporters.get(exporter_id)
        if state is None or seq > state.high:
            return SeqVerdict.NEW
        behind = state.high - seq
        if behind >= self.window:
            return SeqVerdict.STALE
        return SeqVerdict.DUPLICATE if state.seen >> behind & 1 else SeqVerdict.NEW

    def mark(self, exporter_id: str, seq: int) -> None:
        """Record ``seq`` of ``exporter_id`` as applied (after :meth:`check` said new)."""
        state = self._exporters.get(exporter_id)
        if state is None:
            state = _Exporter(seq)
            self._exporters[exporter_id] = state
            if len(self._exporters) > self.max_exporters:
                self._exporters.popitem(last=False)
                self._num_evicted += 1
        else:
            self._exporters.move_to_end(exporter_id)
        if seq > state.high:
            # Shifting by more than the window clears the bitmap: nothing old stays inside.
            state.seen = (state.seen << min(seq - state.high, self.window)) & self._mask
            state.high = seq
        behind = state.high - seq
        if behind < self.window:
            state.seen |= 1 << behind

    def high_water_mark(self, exporter_id: str) -> int | None:
        """The highest ``seq`` applied for ``exporter_id`` (``None`` if not tracked)."""
        state = self._exporters.get(exporter_id)
        return None if state is None else state.high

    def snapshot(self) -> bytes:
        """The whole state as bytes (for the write-ahead log's checkpoint)."""
        state = [
            [exporter_id, e.high, e.seen.to_bytes((self.window + 7) // 8, "little")]
            for exporter_id, e in self._exporters.items()
        ]
        packed: bytes = msgpack.packb(state, use_bin_type=True)
        return packed

    def restore(self, data: bytes) -> None:
        """Take the state of a :meth:`snapshot` (least recently seen first, as saved)."""
        self._exporters.clear()
        if not data:
            return
        for exporter_id, high, seen in msgpack.unpackb(data, raw=False):
            state = _Exporter(high)
            state.seen = int.from_bytes(seen, "little") & self._mask
            self._exporters[exporter_id] = state
        while len(self._exporters) > self.max_exporters:
            self._exporters.popitem(last=False)

    def stats(self) -> DedupStats:
        return DedupStats(num_exporters=len(self._exporters), num_evicted=self._num_evicted)
