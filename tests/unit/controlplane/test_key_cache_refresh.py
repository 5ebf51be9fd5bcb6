"""The key cache's background reads (pure): an entry is claimed for a read again only past
half its life and once at a time; the claim ends with the read's answer or its failure,
and a key revoked here meanwhile is not brought back by that answer."""

from __future__ import annotations

import uuid

from controlplane.models import KeyRole
from controlplane.services.keys import (
    PREFIX_LENGTH,
    AuthenticatedKey,
    KeyCache,
    generate_key,
    hash_key,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def entry(secret: str) -> AuthenticatedKey:
    return AuthenticatedKey(
        id=uuid.uuid4(), name="k", role=KeyRole.VIEWER, tenant=None,
        prefix=secret[:PREFIX_LENGTH], hash=hash_key(secret), last_used_at=None,
    )  # fmt: skip


def test_an_entry_is_claimed_past_half_its_life_once_at_a_time() -> None:
    clock = Clock()
    cache = KeyCache(ttl_s=5.0, clock=clock)
    secret = generate_key()
    key = entry(secret)
    assert not cache.claim_refresh(secret)  # not cached: the request reads it itself
    cache.put((key,))
    clock.now += 2.4
    assert not cache.claim_refresh(secret)
    clock.now += 0.1
    assert cache.claim_refresh(secret)
    assert not cache.claim_refresh(secret)  # one read in flight
    assert cache.get(secret) == key  # still served meanwhile
    cache.put((key,))  # the read's answer: a fresh entry, the claim ended
    assert not cache.claim_refresh(secret)
    clock.now += 2.5
    assert cache.claim_refresh(secret)
    cache.release(secret[:PREFIX_LENGTH])  # the read failed
    assert cache.claim_refresh(secret)


def test_a_background_answer_does_not_bring_back_a_key_revoked_here() -> None:
    clock = Clock()
    cache = KeyCache(ttl_s=5.0, clock=clock)
    secret = generate_key()
    key = entry(secret)
    cache.put((key,))
    clock.now += 3
    assert cache.claim_refresh(secret)
    cache.invalidate(key.id)  # revoked while the read was in flight
    cache.put((key,))  # the read saw the row before the revocation committed
    assert cache.get(secret) is None
