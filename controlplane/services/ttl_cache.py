"""What the control plane's read-through caches share: their bounds and their place.

:class:`KeyCache` (``controlplane.services.keys``) and :class:`SLOCache`
(``controlplane.services.slos_cache``) each keep database answers for at most ``ttl_s``
seconds, at most ``max_entries`` of them (least recently used evicted first), behind one
lock, on a clock a test can drive; and each lives once per database engine
(:func:`engine_of`), so that the writes of any session on that engine reach the cache its
reads use.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sized

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["BoundedTTLCache", "engine_of"]


class BoundedTTLCache:
    """``ttl_s`` (>= 0; 0 turns the cache off), ``max_entries`` (>= 1) and ``clock``
    (monotonic seconds) as plain attributes, and the lock that guards ``_entries``."""

    _entries: Sized

    def __init__(
        self, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not ttl_s >= 0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.clock = clock
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)


def engine_of(bind: AsyncEngine | AsyncConnection | Engine | Connection) -> Engine:
    """The synchronous engine behind ``bind``: the key a per-database cache is kept under."""
    if isinstance(bind, AsyncEngine | AsyncConnection):
        bind = bind.sync_engine
    return bind.engine if isinstance(bind, Connection) else bind
