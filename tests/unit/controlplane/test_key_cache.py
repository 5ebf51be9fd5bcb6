"""The authenticated-key cache (pure): hits compare hashes, entries expire, the size is
bounded, and a revoked key is dropped at once and never cached again."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from controlplane.models import KeyRole
from controlplane.services.keys import (
    PREFIX_LENGTH,
    AuthenticatedKey,
    KeyCache,
    generate_key,
    hash_key,
)

T = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def entry(secret: str, *, name: str = "k", role: KeyRole = KeyRole.INGEST) -> AuthenticatedKey:
    return AuthenticatedKey(
        id=uuid.uuid4(),
        name=name,
        role=role,
        tenant=None,
        prefix=secret[:PREFIX_LENGTH],
        hash=hash_key(secret),
        last_used_at=None,
    )


def with_prefix_of(secret: str) -> str:
    """Another well-formed key that shares ``secret``'s prefix."""
    other = generate_key()
    return secret[:PREFIX_LENGTH] + other[PREFIX_LENGTH:]


def test_a_cached_key_is_found_only_by_its_own_secret() -> None:
    cache = KeyCache(clock=Clock())
    secret = generate_key()
    key = entry(secret)
    cache.put((key,))
    assert cache.get(secret) == key
    assert cache.get(with_prefix_of(secret)) is None  # same prefix, other hash: a miss
    assert cache.get(generate_key()) is None
    assert cache.get("gp_short") is None
    assert cache.get("xx" + secret[2:]) is None


def test_keys_sharing_a_prefix_are_cached_together() -> None:
    cache = KeyCache(clock=Clock())
    first = generate_key()
    second = with_prefix_of(first)
    a, b = entry(first, name="a"), entry(second, name="b")
    cache.put((a, b))
    assert len(cache) == 1
    assert (cache.get(first), cache.get(second)) == (a, b)


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    cache = KeyCache(ttl_s=5.0, clock=clock)
    secret = generate_key()
    cache.put((entry(secret),))
    clock.now += 4.999
    assert cache.get(secret) is not None
    clock.now += 0.001
    assert cache.get(secret) is None
    assert len(cache) == 0  # the stale entry is dropped, not kept


def test_a_zero_ttl_caches_nothing() -> None:
    cache = KeyCache(ttl_s=0.0, clock=Clock())
    secret = generate_key()
    cache.put((entry(secret),))
    assert cache.get(secret) is None


def test_the_least_recently_used_prefix_is_evicted_first() -> None:
    cache = KeyCache(max_entries=2, clock=Clock())
    secrets = [generate_key() for _ in range(3)]
    cache.put((entry(secrets[0]),))
    cache.put((entry(secrets[1]),))
    assert cache.get(secrets[0]) is not None  # now the most recently used
    cache.put((entry(secrets[2]),))
    assert len(cache) == 2
    assert cache.get(secrets[1]) is None
    assert cache.get(secrets[0]) is not None
    assert cache.get(secrets[2]) is not None


def test_invalidate_drops_the_key_at_once_and_refuses_to_cache_it_again() -> None:
    cache = KeyCache(clock=Clock())
    first = generate_key()
    second = with_prefix_of(first)
    revoked, kept = entry(first), entry(second)
    cache.put((revoked, kept))
    cache.invalidate(revoked.id)
    assert cache.get(first) is None
    assert cache.get(second) == kept
    # A lookup that read the row before the revocation committed puts it back: refused.
    cache.put((revoked, kept))
    assert cache.get(first) is None
    assert cache.get(second) == kept
    cache.put((revoked,))
    assert cache.get(first) is None


def test_invalidating_an_unknown_key_is_harmless_and_still_refuses_it_later() -> None:
    cache = KeyCache(clock=Clock())
    secret = generate_key()
    key = entry(secret)
    cache.invalidate(key.id)
    cache.put((key,))
    assert cache.get(secret) is None
    assert len(cache) == 0


def test_touched_records_the_write_so_other_requests_skip_it() -> None:
    cache = KeyCache(clock=Clock())
    secret = generate_key()
    key = entry(secret)
    cache.put((key,))
    updated = cache.touched(key, T)
    assert updated.last_used_at == T
    cached = cache.get(secret)
    assert cached is not None and cached.last_used_at == T
    # Touching a key the cache no longer holds only returns the updated value.
    other = entry(generate_key())
    assert cache.touched(other, T).last_used_at == T
    assert len(cache) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttl_s": -1.0}, "ttl_s must be >= 0, got -1.0"),
        ({"ttl_s": float("nan")}, "ttl_s must be >= 0, got nan"),
        ({"max_entries": 0}, "max_entries must be >= 1, got 0"),
    ],
)
def test_bad_settings_name_the_value(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError) as info:
        KeyCache(**kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_key_cache_ttl_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy import create_engine

    from controlplane.services.keys import key_cache
    from controlplane.settings import Settings

    monkeypatch.setenv("GOODPUT_KEY_CACHE_TTL_S", "0.5")
    settings = Settings()
    engine = create_engine("sqlite://")
    assert key_cache(engine, ttl_s=settings.key_cache_ttl_s).ttl_s == 0.5
    assert key_cache(engine).ttl_s == 0.5  # one cache per database: the first one made stays
    monkeypatch.setenv("GOODPUT_KEY_CACHE_TTL_S", "-1")
    with pytest.raises(ValueError, match="key_cache_ttl_s"):
        Settings()
