"""The KV block pool of one instance, with an LRU prefix cache over trace block ids.

Blocks are ``block_size`` tokens. A job owns the blocks of its context that are not
shared; prefix blocks (one trace block id = ``blocks_per_prefix`` KV blocks) live in the
cache, reference-counted by the jobs reading them. A cached prefix block with no reader
still holds its KV (a later prompt with the same ids skips that prefill) but is evicted,
least recently used first, as soon as an allocation needs its room — vLLM's prefix cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockPool"]


class BlockPool:
    """``capacity`` KV blocks; ``owned`` of them held by jobs alone, the rest of the used
    ones by cached prefix blocks (see the module docstring)."""

    __slots__ = ("_cache", "blocks_per_prefix", "capacity", "evictable", "free", "owned")

    def __init__(self, capacity: int, blocks_per_prefix: int) -> None:
        self.capacity = capacity
        self.blocks_per_prefix = blocks_per_prefix
        self.owned = 0
        self.free = capacity  # neither owned nor cached
        self.evictable = 0  # cached prefix blocks with no reader, in blocks
        self._cache: OrderedDict[int, int] = OrderedDict()  # block id -> readers

    @property
    def available(self) -> int:
        """Blocks an allocation may take: free ones plus evictable cached ones."""
        return self.free + self.evictable

    @property
    def cached_prefix_blocks(self) -> int:
        return len(self._cache)

    def allocate(self, num_blocks: int) -> bool:
        """Take ``num_blocks`` for a job (evicting unreferenced prefix blocks, LRU first);
        ``False``, with nothing taken, when they cannot be had."""
        if num_blocks <= self.free:
            self.owned += num_blocks
            self.free -= num_blocks
            return True
        if num_blocks > self.free + self.evictable:
            return False
        per = self.blocks_per_prefix
        need = num_blocks - self.free
        victims = []
        for block_id, readers in self._cache.items():  # oldest first
            if not readers:
                victims.append(block_id)
                need -= per
                if need <= 0:
                    break
        for block_id in victims:
            del self._cache[block_id]
        self.evictable -= per * len(victims)
        self.free += per * len(victims) - num_blocks
        self.owned += num_blocks
        return True

    def release(self, num_blocks: int) -> None:
        self.owned -= num_blocks
        self.free += num_blocks

    def match(self, block_ids: Sequence[int], limit: int) -> int:
        """How many leading ids of ``block_ids`` (at most ``limit``) are cached."""
        cache = self._cache
        hit = 0
        for block_id in block_ids[:limit]:
            if block_id not in cache:
                break
            hit += 1
        return hit

    def acquire(self, block_ids: Sequence[int]) -> None:
        """A job starts reading these cached blocks (they become most recently used)."""
        cache = self._cache
        for block_id in block_ids:
            readers = cache[block_id]
            if not readers:
                self.evictable -= self.blocks_per_prefix
            cache[block_id] = readers + 1
            cache.move_to_end(block_id)

    def insert(self, block_ids: Sequence[int]) -> None:
        """A job computed these prefix blocks: cache them, read by that job. The caller
        moves the job's ``blocks_per_prefix`` blocks per id from owned to shared (a block
        another job cached meanwhile is shared rather than kept twice)."""
        cache = self._cache
        per = self.blocks_per_prefix
        for block_id in block_ids:
            readers = cache.get(block_id)
            if readers is None:
                cache[block_id] = 1
            else:  # computed twice: keep the cached copy, free this one
                if not readers:
                    self.evictable -= per
                cache[block_id] = readers + 1
                cache.move_to_end(block_id)
                self.free += per
        self.owned -= per * len(block_ids)

    def release_prefix(self, block_ids: Sequence[int]) -> None:
        """A job stops reading these blocks; they stay cached, evictable when unread."""
        cache = self._cache
        for block_id in block_ids:
            readers = cache[block_id] - 1
            cache[block_id] = readers
            if not readers:
                self.evictable += self.blocks_per_prefix
