"""The load view admission decides from: running sums of the gateway's in-flight work.

Admission runs once per request on the event loop and must cost a few microseconds, so it
never scans the instances. :class:`LoadTracker` keeps, as the work changes (a prefill
starts or ends, a decode stream opens or closes — the calls the relay already makes on the
pool), the few numbers the rule reads:

* the least-loaded eligible prefill instance and its queued prompt tokens (what routing
  will pick, least outstanding work: the tokens ahead of a new request);
* the requests in prefill now (they join the decode pool before a new request does);
* the decode streams running on the decode pool and its number of instances;
* the number of prefill instances;
* where the engines serve by priority (the gateway's ``--engine-priority``), the queued prompt
  tokens of each instance by the engine priority they were sent with
  (:meth:`LoadTracker.tokens_ahead`: what a request of a given priority waits for).

Each update is O(1), except when the least-loaded prefill instance gains work: then the
prefill instances are scanned once to find the new minimum (O(prefill instances), on the
update path, never in :meth:`decide`). Membership and health changes (fleet syncs) rebuild
the view from the pool's snapshot.

:class:`TrackedPool` is the gateway's :class:`~serving.gateway.pool.InstancePool` with the
tracker kept in step. The simulator's adapter feeds a tracker directly.
"""

from __future__ import annotations

from collections.abc import Iterable

from exporters.fleet import FleetMember, PoolRole
from serving.gateway.pool import InstancePool, StaticInstance
from serving.gateway.routing import InstanceState

__all__ = ["LoadTracker", "TrackedPool"]


class LoadTracker:
    """Running sums of in-flight work (see the module docstring). Not thread-safe: one
    event loop (or one simulator) owns it."""

    __slots__ = (
        "_by_priority",
        "_decode",
        "_prefill",
        "decode_streams",
        "min_prefill_id",
        "min_prefill_tokens",
        "num_decode",
        "num_prefill",
        "prefill_requests",
    )

    def __init__(self) -> None:
        self._prefill: dict[str, int] = {}  # eligible prefill-serving instance → tokens
        self._decode: dict[str, int] = {}  # eligible decode-serving instance → streams
        # instance → engine priority → queued prompt tokens (any instance with some: an
        # instance out of the pool for a while keeps its count for when it comes back)
        self._by_priority: dict[str, dict[int, int]] = {}
        self.prefill_requests = 0
        self.decode_streams = 0
        self.num_decode = 0
        self.num_prefill = 0
        self.min_prefill_id: str | None = None
        self.min_prefill_tokens = 0

    def sync(self, states: Iterable[InstanceState]) -> None:
        """Rebuild from a snapshot of the instances (membership, roles, health changed).
        ``prefill_requests`` is kept: the pool counts tokens, not requests."""
        states = list(states)
        self._prefill = {
            s.id: s.prefill_tokens for s in states if s.healthy and s.serves(PoolRole.PREFILL)
        }
        self._decode = {
            s.id: s.decode_streams for s in states if s.healthy and s.serves(PoolRole.DECODE)
        }
        self.decode_streams = sum(self._decode.values())
        self.num_decode = len(self._decode)
        self.num_prefill = len(self._prefill)
        self._rescan()

    def add(
        self,
        instance_id: str,
        prefill_tokens: int = 0,
        decode_streams: int = 0,
        engine_priority: int = 0,
    ) -> None:
        """In-flight work of ``instance_id`` changed by these amounts (the pool's
        ``add_load``). A positive ``prefill_tokens`` is one request entering prefill, a
        negative one a request leaving it; ``engine_priority`` is the priority it was sent
        to the engine with (0 where the engines serve in arrival order)."""
        if prefill_tokens:
            self._count(instance_id, engine_priority, prefill_tokens)
            step = 1 if prefill_tokens > 0 else -1
            self.prefill_requests = max(0, self.prefill_requests + step)
            old = self._prefill.get(instance_id)
            if old is not None:
                new = max(0, old + prefill_tokens)
                self._prefill[instance_id] = new
                if self.min_prefill_id is None or new < self.min_prefill_tokens:
                    self.min_prefill_id, self.min_prefill_tokens = instance_id, new
                elif instance_id == self.min_prefill_id:
                    if new > old:
                        self._rescan()
                    else:
                        self.min_prefill_tokens = new
        if decode_streams:
            old_streams = self._decode.get(instance_id)
            if old_streams is not None:
                new_streams = max(0, old_streams + decode_streams)
                self._decode[instance_id] = new_streams
                self.decode_streams += new_streams - old_streams

    def _count(self, instance_id: str, engine_priority: int, tokens: int) -> None:
        counts = self._by_priority.get(instance_id)
        if counts is None:
            if tokens <= 0:
                return
            counts = self._by_priority[instance_id] = {}
        left = counts.get(engine_priority, 0) + tokens
        if left > 0:
            counts[engine_priority] = left
        else:
            counts.pop(engine_priority, None)
            if not counts:
                del self._by_priority[instance_id]

    def tokens_ahead(self, engine_priority: int | None) -> int:
        """The queued prompt tokens on the least-loaded prefill instance that a request sent
        with ``engine_priority`` waits for: those sent with the same or a lower number (the
        engine serves lower numbers first, equal ones in arrival order). ``None`` (the
        engines serve in arrival order): all of them, ``min_prefill_tokens``.
        O(distinct priorities queued there)."""
        total = self.min_prefill_tokens
        if engine_priority is None or self.min_prefill_id is None:
            return total
        counts = self._by_priority.get(self.min_prefill_id)
        if not counts:
            return 0
        ahead = sum(n for p, n in counts.items() if p <= engine_priority)
        return min(total, ahead)

    def _rescan(self) -> None:
        if not self._prefill:
            self.min_prefill_id, self.min_prefill_tokens = None, 0
            return
        best = min(self._prefill, key=self._prefill.__getitem__)  # first of equals
        self.min_prefill_id, self.min_prefill_tokens = best, self._prefill[best]


class TrackedPool(InstancePool):
    """An :class:`InstancePool` that keeps a :class:`LoadTracker` in step with it."""

    def __init__(
        self,
        static: Iterable[StaticInstance] = (),
        *,
        tracker: LoadTracker,
        cooldown_s: float = 5.0,
        max_affinity_keys: int = 65_536,
    ) -> None:
        super().__init__(static, cooldown_s=cooldown_s, max_affinity_keys=max_affinity_keys)
        self.tracker = tracker
        tracker.sync(self.states())

    def add_load(
        self,
        instance_id: str,
        *,
        prefill_tokens: int = 0,
        decode_streams: int = 0,
        engine_priority: int = 0,
    ) -> None:
        super().add_load(instance_id, prefill_tokens=prefill_tokens, decode_streams=decode_streams)
        self.tracker.add(instance_id, prefill_tokens, decode_streams, engine_priority)

    def apply_fleet(self, members: Iterable[FleetMember]) -> None:
        super().apply_fleet(members)
        self.tracker.sync(self.states())
