"""The SLO reference cache (pure): entries expire at the TTL and are never served past it,
a read begun before a clearing is not cached, an entry past half its life is read again in
the background (once at a time) while it is served, and the size is bounded."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from controlplane.services.slos_cache import CachedSLO, SLOCache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def slo(name: str = "chat", version: int = 1, tenant: str | None = None) -> CachedSLO:
    return CachedSLO(id=uuid.uuid4(), name=name, version=version, tenant=tenant)


class Database:
    """A stand-in for the registry: ``rows`` by reference; counts reads."""

    def __init__(self, **rows: CachedSLO) -> None:
        self.rows: dict[str, CachedSLO | None] = dict(rows)
        self.reads = 0
        self.fail = False
        self.gate: asyncio.Event | None = None

    async def fetch(self, ref: str) -> CachedSLO | None:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise ConnectionError("database away")
        return self.rows.get(ref)


async def settle(cache: SLOCache) -> None:
    while cache._refreshing:
        await asyncio.sleep(0)


def test_an_entry_is_served_until_the_ttl_and_never_after() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, clock=clock)
    chat = slo()
    cache.put("chat", chat, cache.generation, clock())
    clock.now += 0.999
    hit = cache.get("chat")
    assert hit is not None
    assert hit[0] == chat
    assert hit[1] == pytest.approx(0.999)
    clock.now += 0.001
    assert cache.get("chat") is None
    assert len(cache) == 0


def test_a_read_begun_before_a_clearing_is_not_cached() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, clock=clock)
    generation = cache.generation  # a read starts ...
    cache.clear()  # ... an SLO is written and committed here ...
    cache.put("chat", slo(), generation, clock())  # ... the old answer arrives
    assert cache.get("chat") is None


def test_no_live_slo_drops_the_entry_and_ttl_zero_caches_nothing() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, clock=clock)
    cache.put("chat", slo(), cache.generation, clock())
    cache.put("chat", None, cache.generation, clock())
    assert cache.get("chat") is None
    off = SLOCache(ttl_s=0.0, clock=clock)
    off.put("chat", slo(), off.generation, clock())
    assert off.get("chat") is None


def test_the_least_recently_used_reference_is_evicted() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, max_entries=2, clock=clock)
    for ref in ("a", "b"):
        cache.put(ref, slo(ref), cache.generation, clock())
    assert cache.get("a") is not None  # "b" is now the least recently used
    cache.put("c", slo("c"), cache.generation, clock())
    assert cache.get("b") is None
    assert cache.get("a") is not None
    assert cache.get("c") is not None


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        SLOCache(ttl_s=-1)
    with pytest.raises(ValueError, match="max_entries"):
        SLOCache(max_entries=0)


async def test_a_miss_reads_the_database_and_a_hit_does_not() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, clock=clock)
    database = Database(chat=slo())
    assert await cache.resolve("chat", database.fetch) == database.rows["chat"]
    clock.now += 0.4
    assert await cache.resolve("chat", database.fetch) == database.rows["chat"]
    assert database.reads == 1
    assert await cache.resolve("nope", database.fetch) is None
    assert await cache.resolve("nope", database.fetch) is None
    assert database.reads == 3  # an unknown reference is asked each time


async def test_past_half_its_life_an_entry_is_read_again_in_the_background() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, clock=clock)
    old, new = slo(version=1), slo(version=2)
    database = Database(chat=old)
    await cache.resolve("chat", database.fetch)
    database.rows["chat"] = new  # changed by another process
    database.gate = asyncio.Event()
    clock.now += 0.5
    # Served from the cache at once, with one read started (not one per request).
    assert await cache.resolve("chat", database.fetch) == old
    assert await cache.resolve("chat", database.fetch) == old
    await asyncio.sleep(0)
    assert database.reads == 2
    database.gate.set()
    await settle(cache)
    assert await cache.resolve("chat", database.fetch) == new
    clock.now += 0.99  # the background read renewed the entry
    hit = cache.get("chat")  # None had the entry not been renewed
    assert hit is not None
    assert hit[0] == new
    assert database.reads == 2


async def test_a_deletion_seen_by_the_background_read_drops_the_entry() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, clock=clock)
    database = Database(chat=slo())
    await cache.resolve("chat", database.fetch)
    database.rows["chat"] = None
    clock.now += 0.6
    assert await cache.resolve("chat", database.fetch) is not None
    await settle(cache)
    assert await cache.resolve("chat", database.fetch) is None


async def test_a_failed_background_read_keeps_the_entry_until_it_expires() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, clock=clock)
    database = Database(chat=slo())
    await cache.resolve("chat", database.fetch)
    database.fail = True
    clock.now += 0.6
    assert await cache.resolve("chat", database.fetch) is not None
    await settle(cache)
    clock.now += 0.3
    assert await cache.resolve("chat", database.fetch) is not None
    await settle(cache)
    clock.now += 0.2  # expired: the request reads the database itself, and sees it fail
    with pytest.raises(ConnectionError):
        await cache.resolve("chat", database.fetch)


async def test_a_clearing_during_a_background_read_keeps_its_answer_out() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, clock=clock)
    database = Database(chat=slo())
    await cache.resolve("chat", database.fetch)
    database.gate = asyncio.Event()
    clock.now += 0.6
    await cache.resolve("chat", database.fetch)
    await asyncio.sleep(0)
    cache.clear()  # an SLO written here while the read was in flight
    database.gate.set()
    await settle(cache)
    assert cache.get("chat") is None


def test_a_fill_stores_every_slo_by_id_and_name_dated_at_its_read() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, clock=clock)
    chat, code = slo("chat"), slo("code")
    generation, read_at = cache.generation, clock()
    clock.now += 0.4  # the poll's read took this long
    assert cache.fill([chat, code], generation, read_at)
    for ref, expected in (("chat", chat), (str(code.id), code)):
        hit = cache.get(ref)
        assert hit is not None
        assert hit[0] == expected
        assert hit[1] == pytest.approx(0.4)
    clock.now = read_at + 1.0  # served at most the TTL after the read began
    assert cache.get("chat") is None
    assert cache.get(str(code.id)) is None


def test_a_fill_is_refused_after_a_clearing_and_when_it_would_not_fit() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, max_entries=8, clock=clock)
    generation = cache.generation
    cache.clear()  # an SLO written here while the poll read
    assert not cache.fill([slo()], generation, clock())
    assert len(cache) == 0
    assert not cache.fill([slo(f"s{i}") for i in range(3)], cache.generation, clock())
    assert cache.fill([slo(f"s{i}") for i in range(2)], cache.generation, clock())
    assert len(cache) == 4


def test_a_fill_keeps_a_newer_entry() -> None:
    clock = Clock()
    cache = SLOCache(ttl_s=1.0, clock=clock)
    old, new = slo("chat", version=1), slo("chat", version=2)
    poll_read_at = clock()
    clock.now += 0.3
    cache.put("chat", new, cache.generation, clock())  # a query's read, after the poll's
    assert cache.fill([old], cache.generation, poll_read_at)
    assert cache.get("chat") == (new, 0.0)
