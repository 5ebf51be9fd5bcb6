"""The gateway's view of the simulated fleet, and routing through the live routing code.

:class:`Router` keeps what the live gateway keeps (``serving/gateway/pool.py``): each
instance's in-flight prompt tokens and decode streams as the gateway counts them, and
the prefix-affinity table (most recent 65 536 keys), and routes every request with
:func:`serving.gateway.routing.choose` — the function the live gateway calls — with the
simulator's virtual clock.

``choose`` is linear in the instances it is shown; with hundreds of instances and a
million requests, showing it the whole fleet each time would dominate the simulation. So
the router shows it a *candidate set* that provably yields the decision it would take on
the whole fleet: per pool, the least-loaded eligible instance (first listed among
equals), the second one for decode when the first also serves prefill (``choose`` keeps
the prefill instance out of the decode choice when another one is eligible), and the
instances the request's affinity key is pinned to, in fleet order. Loads sit in lazy
min-heaps of ``(work, index)``, with work computed as ``choose`` computes it
(``decode_stream_tokens`` is passed to it explicitly). ``exact=True`` shows ``choose`` the
whole fleet instead (tests compare the two).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence

from exporters.fleet import PoolRole
from serving.gateway.routing import InstanceState, RouteRequest, choose

__all__ = ["DECODE_STREAM_TOKENS", "MAX_AFFINITY_KEYS", "Router"]

#: Weight of one decode stream in decode work (``choose``'s ``decode_stream_tokens``).
DECODE_STREAM_TOKENS = 256
#: Affinity keys the gateway remembers (``InstancePool``'s default).
MAX_AFFINITY_KEYS = 65_536
_MEMO_SIZE = 256


class _LoadHeap:
    """Instances of one pool by work, lazily: stale entries are dropped when they surface."""

    __slots__ = ("entries", "limit", "members")

    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []
        self.members: set[int] = set()
        self.limit = 64  # rebuild past this many entries


class Router:
    """Routing state of the simulated gateway (see the module docstring).

    ``ids`` name the instances in fleet order; ``roles`` their pools. ``colocated`` routes
    whole requests to one instance (``RouteRequest.colocated``).
    """

    def __init__(
        self,
        ids: Sequence[str],
        roles: Sequence[PoolRole],
        *,
        colocated: bool,
        exact: bool = False,
    ) -> None:
        if len(ids) != len(roles):
            raise ValueError(f"ids and roles must have one length, got {len(ids)}, {len(roles)}")
        self.ids = list(ids)
        self.index = {instance_id: i for i, instance_id in enumerate(self.ids)}
        self.colocated = colocated
        self.exact = exact
        self.prefill_tokens = [0] * len(ids)
        self.decode_streams = [0] * len(ids)
        self.affinity: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self.roles: list[PoolRole] = []
        self.pool_names: list[str] = []
        self._prefill = _LoadHeap()
        self._decode = _LoadHeap()
        self.set_roles(roles)

    # -- load, as the gateway counts it ---------------------------------------------------

    def _prefill_work(self, i: int) -> int:
        return self.prefill_tokens[i]

    def _decode_work(self, i: int) -> int:
        return self.decode_streams[i] * DECODE_STREAM_TOKENS + self.prefill_tokens[i]

    def add_prefill_tokens(self, i: int, tokens: int) -> None:
        self.prefill_tokens[i] += tokens
        self._changed(i)

    def add_decode_streams(self, i: int, streams: int) -> None:
        self.decode_streams[i] += streams
        self._changed(i)

    def _changed(self, i: int) -> None:
        if i in self._prefill.members:
            heapq.heappush(self._prefill.entries, (self.prefill_tokens[i], i))
        if i in self._decode.members:
            heapq.heappush(self._decode.entries, (self._decode_work(i), i))

    def pin(self, key: str | None, prefill_id: str, decode_id: str) -> None:
        """Remember where ``key``'s prefix went (``InstancePool.pin``)."""
        if key is None:
            return
        table = self.affinity
        table[key] = (prefill_id, decode_id)
        table.move_to_end(key)
        if len(table) > MAX_AFFINITY_KEYS:
            table.popitem(last=False)

    def set_roles(self, roles: Sequence[PoolRole]) -> None:
        """Put instances in pools (a PD planner moving workers); loads are kept."""
        if len(roles) != len(self.ids):
            raise ValueError(f"roles: expected {len(self.ids)}, got {len(roles)}")
        self.roles = [PoolRole(r) for r in roles]
        # Snapshots are immutable: one per (instance, prefill tokens, decode streams) is
        # kept and reused while the load comes back to it (a decode instance's does, all
        # the time), at most _MEMO_SIZE per instance.
        self._states: list[dict[tuple[int, int], InstanceState]] = [{} for _ in self.ids]
        self._requests: dict[int, RouteRequest] = {}
        self.pool_names = [r.value for r in self.roles]
        for heap, pool in ((self._prefill, PoolRole.PREFILL), (self._decode, PoolRole.DECODE)):
            heap.members = {i for i, r in enumerate(self.roles) if r is PoolRole.BOTH or r is pool}
            self._rebuild(heap)

    def _rebuild(self, heap: _LoadHeap) -> None:
        work = self._prefill_work if heap is self._prefill else self._decode_work
        heap.entries = [(work(i), i) for i in sorted(heap.members)]
        heapq.heapify(heap.entries)
        heap.limit = 4 * len(heap.members) + 64

    # -- routing --------------------------------------------------------------------------

    def _least(self, heap: _LoadHeap, skip: int = -1) -> int:
        """The least-loaded member (first listed among equals) other than ``skip``; -1 if
        none. Pops stale entries on the way."""
        entries = heap.entries
        if len(entries) > heap.limit:
            self._rebuild(heap)
            entries = heap.entries
        members = heap.members
        streams = self.decode_streams if heap is self._decode else None
        tokens = self.prefill_tokens
        held = None
        found = -1
        while entries:
            w, i = entries[0]
            current = (
                tokens[i] if streams is None else streams[i] * DECODE_STREAM_TOKENS + tokens[i]
            )
            if w != current or i not in members:
                heapq.heappop(entries)
            elif i == skip:
                if held is None:
                    held = []
                held.append(heapq.heappop(entries))
            else:
                found = i
                break
        if held:
            for entry in held:
                heapq.heappush(entries, entry)
        return found

    def states(self, indices: Sequence[int] | None = None) -> list[InstanceState]:
        """Snapshots of the given instances (default: the whole fleet), in fleet order."""
        chosen = range(len(self.ids)) if indices is None else sorted(set(indices))
        memos = self._states
        tokens, streams = self.prefill_tokens, self.decode_streams
        out = []
        for i in chosen:
            load = (tokens[i], streams[i])
            memo = memos[i]
            state = memo.get(load)
            if state is None:
                if len(memo) >= _MEMO_SIZE:
                    memo.clear()
                state = memo[load] = InstanceState(
                    id=self.ids[i],
                    url=self.ids[i],
                    role=self.roles[i],
                    prefill_tokens=load[0],
                    decode_streams=load[1],
                )
            out.append(state)
        return out

    def route(self, prompt_tokens: int, key: str | None, now_s: float) -> tuple[int, int]:
        """``(prefill index or -1 when colocated, decode index)`` for a request, decided
        by ``choose``; raises :class:`~serving.gateway.routing.NoInstanceError`."""
        request = self._requests.get(prompt_tokens) if key is None else None
        if request is None:  # immutable, and it holds the live affinity table: reusable
            request = RouteRequest(
                prompt_tokens=prompt_tokens,
                affinity_key=key,
                affinity=self.affinity,
                colocated=self.colocated,
            )
            if key is None and len(self._requests) < _MEMO_SIZE * 64:
                self._requests[prompt_tokens] = request
        if self.exact:
            states = self.states()
        else:
            candidates = self._candidates(key)
            states = self.states(candidates) if candidates else self.states()
        decision = choose(states, request, now_s, decode_stream_tokens=DECODE_STREAM_TOKENS)
        index = self.index
        prefill = -1 if decision.prefill is None else index[decision.prefill.id]
        return prefill, index[decision.decode.id]

    def _candidates(self, key: str | None) -> list[int]:
        """The instances ``choose`` needs to see (module docstring); empty when a pool has
        no eligible instance, so that the whole fleet explains the error."""
        decode = self._least(self._decode)
        if decode < 0:
            return []
        out = [decode]
        if not self.colocated:
            prefill = self._least(self._prefill)
            if prefill < 0:
                return []
            out.append(prefill)
            if decode in self._prefill.members:  # it may be the prefill choice too
                second = self._least(self._decode, skip=decode)
                if second >= 0:
                    out.append(second)
        pinned = self.affinity.get(key) if key is not None else None
        if pinned is not None:
            out.extend(self.index[i] for i in pinned if i in self.index)
        return out
