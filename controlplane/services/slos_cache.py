"""SLO references resolved without a database round trip per request.

A goodput query names its SLO by id or name; the answer comes from the engine, in memory,
and the database is asked only which SLO the name means now (its id, version and tenant).
:class:`SLOCache` remembers that answer per reference, one cache per database engine
(:func:`slo_cache`), like the key cache (``controlplane.services.keys``).

**The bound.** An entry is served for at most ``ttl_s`` (setting ``slo_cache_ttl_s``, 1 s)
after the database read that made it, never longer: an SLO updated, renamed or deleted by
another process (another replica, the CLI) keeps its previous reference here for at most
``ttl_s``, and the query's answer after that is the database's. A write through this
process applies at once: the service functions that create, update or delete an SLO clear
the cache, and clear it again when their transaction commits (a read that raced the
write cannot put the old row back: :meth:`SLOCache.put` refuses what was read before the
last clearing). An unknown reference is not remembered, so an SLO created elsewhere is
found at once.

**Filled by the SLO poll.** The live engine reads the ``slo`` table's fingerprint every
``slo_poll_interval_s`` (1 s) and the live SLOs when it changed
(``controlplane.runtime.live``); each poll that succeeds stores every live SLO here by id
and by name (:meth:`SLOCache.fill`), dated when the poll's read began. The bound above
holds (the poll is a read of the database, and an entry is still served at most ``ttl_s``
after it), and a replica's first query, or one after an idle spell, finds its SLO here
without a read of its own.

**No miss on a busy path.** A reference asked for in the second half of its life is read
again in the background (one read at a time per reference) while the cached one is
served: under steady queries an entry is replaced before it expires, and requests do not
wait for the database. A failed background read keeps the entry until it expires; the
next request then reads the database itself (and answers 503 if it is away).

Example::

    cache = slo_cache(engine, ttl_s=1.0)
    slo = await cache.resolve("chat", fetch)  # fetch(ref) reads the database on a miss
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from controlplane.models import SLO
from controlplane.services.ttl_cache import BoundedTTLCache, engine_of

__all__ = [
    "SLO_CACHE_MAX_ENTRIES",
    "SLO_CACHE_TTL_S",
    "CachedSLO",
    "Fetch",
    "SLOCache",
    "slo_cache",
]

logger = logging.getLogger(__name__)

#: How long a reference read from the database is trusted: the longest an SLO changed or
#: deleted by another process keeps its previous reference here.
SLO_CACHE_TTL_S = 1.0
#: References remembered per database (least recently used evicted first).
SLO_CACHE_MAX_ENTRIES = 10_000


@dataclass(frozen=True, slots=True)
class CachedSLO:
    """What a goodput query needs to know about a live SLO (a plain value, safe to share
    between requests, unlike an ORM row)."""

    id: uuid.UUID
    name: str
    version: int
    tenant: str | None

    @classmethod
    def of(cls, slo: SLO) -> CachedSLO:
        return cls(slo.id, slo.name, slo.version, slo.selector.get("tenant"))


#: Reads one reference from the database: the live SLO it names, or ``None``.
Fetch = Callable[[str], Awaitable[CachedSLO | None]]


class SLOCache(BoundedTTLCache):
    """Live SLOs by reference (id or name) for at most ``ttl_s`` (see the module).

    Thread-safe for :meth:`get`, :meth:`put` and :meth:`clear`; :meth:`resolve` runs on
    an event loop. ``clock`` (monotonic seconds) and ``ttl_s`` are plain attributes, so a
    test can drive time; ``ttl_s = 0`` turns the cache off (every lookup reads the
    database).
    """

    def __init__(
        self,
        ttl_s: float = SLO_CACHE_TTL_S,
        max_entries: int = SLO_CACHE_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(ttl_s, max_entries, clock)
        self._entries: OrderedDict[str, tuple[float, CachedSLO]] = OrderedDict()  # read at
        self._generation = 0  # bumped by clear(): reads begun before it are not cached
        self._refreshing: dict[str, asyncio.Task[None]] = {}

    @property
    def generation(self) -> int:
        """How many times the cache was cleared (a read records it before it starts)."""
        return self._generation

    def get(self, ref: str) -> tuple[CachedSLO, float] | None:
        """The cached SLO for ``ref`` and its age in seconds, or ``None`` (not cached, or
        older than ``ttl_s``: ask the database)."""
        with self._lock:
            entry = self._entries.get(ref)
            if entry is None:
                return None
            age = self.clock() - entry[0]
            if age >= self.ttl_s:
                del self._entries[ref]
                return None
            self._entries.move_to_end(ref)
            return entry[1], age

    def put(self, ref: str, slo: CachedSLO | None, generation: int, read_at: float) -> None:
        """Remember what the database said about ``ref`` at ``read_at`` (``None``: no live
        SLO, the entry is dropped). Refused when the cache was cleared since the read
        began (``generation``): a write committed in between may have changed the answer."""
        with self._lock:
            if generation != self._generation:
                return
            if slo is None or self.ttl_s == 0:
                self._entries.pop(ref, None)
                return
            self._store(ref, slo, read_at)
            self._evict()

    def fill(self, slos: Collection[CachedSLO], generation: int, read_at: float) -> bool:
        """Remember every live SLO the database listed at ``read_at``, by id and by name (the
        live engine's SLO poll, so that a query finds its SLO here without a read of its
        own). Refused, as :meth:`put`, when the cache was cleared since the read began, and
        when the entries would not fit (two per SLO, at most half of ``max_entries``: the
        references queried stay). Returns whether the entries were stored."""
        with self._lock:
            if generation != self._generation or self.ttl_s == 0:
                return False
            if 4 * len(slos) > self.max_entries:
                return False
            for slo in slos:
                for ref in (str(slo.id), slo.name):
                    current = self._entries.get(ref)
                    if current is None or current[0] <= read_at:
                        self._store(ref, slo, read_at)
            self._evict()
            return True

    def _store(self, ref: str, slo: CachedSLO, read_at: float) -> None:
        """Newest use last (the lock held)."""
        self._entries[ref] = (read_at, slo)
        self._entries.move_to_end(ref)

    def _evict(self) -> None:
        """Drop the least recently used entries above ``max_entries`` (the lock held)."""
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every entry, and refuse the reads in flight (an SLO was written here)."""
        with self._lock:
            self._entries.clear()
            self._generation += 1

    async def read(self, ref: str, fetch: Fetch) -> CachedSLO | None:
        """Ask the database now (``fetch``) and cache its answer."""
        generation, read_at = self._generation, self.clock()
        slo = await fetch(ref)
        self.put(ref, slo, generation, read_at)
        return slo

    async def resolve(self, ref: str, fetch: Fetch) -> CachedSLO | None:
        """The live SLO named by ``ref`` (``None``: none), from the cache when it holds a
        fresh entry (read again in the background past half its life), else from
        ``fetch``."""
        hit = self.get(ref)
        if hit is None:
            return await self.read(ref, fetch)
        slo, age = hit
        if age >= self.ttl_s / 2 and ref not in self._refreshing:
            task = asyncio.get_running_loop().create_task(self._refresh(ref, fetch))
            self._refreshing[ref] = task
            task.add_done_callback(lambda _: self._refreshing.pop(ref, None))
        return slo

    async def _refresh(self, ref: str, fetch: Fetch) -> None:
        try:
            await self.read(ref, fetch)
        except Exception as exc:  # the entry expires on its own; the next miss reports
            logger.debug("background read of SLO %r failed: %s", ref, exc)


_caches: weakref.WeakKeyDictionary[Engine, SLOCache] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def slo_cache(
    bind: AsyncEngine | AsyncConnection | Engine | Connection, *, ttl_s: float | None = None
) -> SLOCache:
    """The SLO cache of the database behind ``bind`` (created on first use; gone with the
    engine), with ``ttl_s`` when given (else as it is, :data:`SLO_CACHE_TTL_S` when new).
    One per database engine, so that the writes of any session on it clear the cache that
    queries read."""
    engine = engine_of(bind)
    with _caches_lock:
        cache = _caches.get(engine)
        if cache is None:
            cache = _caches[engine] = SLOCache()
        if ttl_s is not None and ttl_s != cache.ttl_s:
            if not ttl_s >= 0:
                raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
            cache.ttl_s = ttl_s
        return cache
