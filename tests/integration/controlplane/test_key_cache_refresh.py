"""The key cache's background reads against the real database (SQLite and PostgreSQL): a
key used past half its entry's life is answered from the cache while it is read again, so
a busy key never waits for its lookup, and a revocation by another process is seen by
that read (within the TTL, as before)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from controlplane.db import utcnow
from controlplane.models import APIKey, KeyRole
from controlplane.services import keys as key_service
from tests.integration.controlplane.conftest import MakeKey, bearer
from tests.integration.controlplane.test_key_cache import (
    SLOS,
    UNKNOWN,
    Clock,
    key_lookups,
    statements,
)

pytestmark = pytest.mark.integration


async def settle() -> None:
    while key_service._refreshes:
        await asyncio.sleep(0.01)


async def test_a_busy_key_is_read_again_before_it_expires(
    app: FastAPI, client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    clock = Clock()
    key_service.key_cache(app.state.engine).clock = clock
    headers = bearer(await make_key(KeyRole.VIEWER))
    assert (await client.get(SLOS, headers=headers)).status_code == 200
    for _ in range(4):  # each step past half the entry's life: renewed in the background
        clock.now += key_service.KEY_CACHE_TTL_S * 0.6
        assert (await client.get(SLOS, headers=headers)).status_code == 200
        await settle()
    with statements(app) as seen:  # 2.4 TTLs after the first lookup: still no wait
        assert (await client.get(SLOS, headers=headers)).status_code == 200
    assert key_lookups(seen) == []


async def test_a_revocation_elsewhere_is_seen_by_the_background_read(
    app: FastAPI, client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    clock = Clock()
    key_service.key_cache(app.state.engine).clock = clock
    secret = await make_key(KeyRole.VIEWER)
    assert (await client.get(SLOS, headers=bearer(secret))).status_code == 200
    async with app.state.engine.begin() as conn:  # another replica revokes the key
        await conn.execute(
            sa.update(APIKey).where(APIKey.prefix == secret[:11]).values(revoked_at=utcnow())
        )
    clock.now += key_service.KEY_CACHE_TTL_S * 0.5
    assert (await client.get(SLOS, headers=bearer(secret))).status_code == 200  # cached
    await settle()
    response = await client.get(SLOS, headers=bearer(secret))
    assert response.status_code == 401
    assert response.json() == UNKNOWN
