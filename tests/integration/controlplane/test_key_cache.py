"""The authenticated-key cache against the real database (SQLite and PostgreSQL): a busy
key is looked up once per TTL, ``last_used_at`` is written at most once per resolution,
a revocation here applies at once and one made by another process within the TTL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from controlplane.db import utcnow
from controlplane.main import create_app
from controlplane.models import APIKey, KeyRole
from controlplane.services import keys as key_service
from controlplane.settings import Settings
from tests.integration.controlplane.conftest import MakeKey, bearer, empty_tables

pytestmark = pytest.mark.integration

SLOS = "/api/v1/slos"
UNKNOWN = {"detail": "invalid API key: unknown or revoked"}


@contextmanager
def statements(app: FastAPI) -> Iterator[list[str]]:
    """The SQL statements the app's database engine runs inside the block."""
    seen: list[str] = []

    def record(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(" ".join(statement.split()))

    engine = app.state.engine.sync_engine
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def key_lookups(seen: list[str]) -> list[str]:
    return [s for s in seen if s.startswith("SELECT") and "FROM api_key" in s]


def key_writes(seen: list[str]) -> list[str]:
    return [s for s in seen if s.startswith("UPDATE api_key")]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_busy_key_is_looked_up_once_per_ttl(
    app: FastAPI, client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    clock = Clock()
    key_service.key_cache(app.state.engine).clock = clock
    headers = bearer(await make_key(KeyRole.VIEWER))
    with statements(app) as seen:
        for _ in range(5):
            assert (await client.get(SLOS, headers=headers)).status_code == 200
    assert len(key_lookups(seen)) == 1
    assert len(key_writes(seen)) == 1  # the first use sets last_used_at
    clock.now += key_service.KEY_CACHE_TTL_S
    with statements(app) as seen:
        assert (await client.get(SLOS, headers=headers)).status_code == 200
    assert len(key_lookups(seen)) == 1  # expired: asked again
    assert key_writes(seen) == []  # last_used_at is fresh (resolution 60 s)


async def test_last_used_at_is_written_again_once_older_than_the_resolution(
    database_url: str,
) -> None:
    app = create_app(Settings(database_url=database_url, key_last_used_resolution_s=0.0))
    async with app.router.lifespan_context(app):
        try:
            async with app.state.sessions() as session, session.begin():
                _, secret = await key_service.create_key(
                    session,
                    name="busy",
                    role=KeyRole.VIEWER,
                    tenant=None,
                    actor="cli",
                    now=utcnow(),
                )
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                with statements(app) as seen:
                    for _ in range(3):
                        response = await client.get(SLOS, headers=bearer(secret))
                        assert response.status_code == 200
            assert len(key_lookups(seen)) == 1
            assert len(key_writes(seen)) == 3  # resolution 0: every use, key from the cache
            async with app.state.sessions() as session:
                stored = await session.scalar(
                    sa.select(APIKey.last_used_at).where(APIKey.prefix == secret[:11])
                )
            assert stored is not None
        finally:
            await empty_tables(app)


async def test_revoking_here_refuses_a_cached_key_at_once(
    client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    created = await client.post(
        "/api/v1/keys", json={"name": "hot", "role": "viewer"}, headers=admin_headers
    )
    key = created.json()
    headers = bearer(key["key"])
    for _ in range(3):  # cached now
        assert (await client.get(SLOS, headers=headers)).status_code == 200
    revoked = await client.delete(f"/api/v1/keys/{key['id']}", headers=admin_headers)
    assert revoked.status_code == 204
    response = await client.get(SLOS, headers=headers)
    assert response.status_code == 401
    assert response.json() == UNKNOWN


async def test_a_key_revoked_by_another_process_stops_within_the_ttl(
    app: FastAPI, client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    clock = Clock()
    key_service.key_cache(app.state.engine).clock = clock
    secret = await make_key(KeyRole.VIEWER)
    assert (await client.get(SLOS, headers=bearer(secret))).status_code == 200
    # Another replica (or the CLI) revokes the key: this process's cache does not know.
    async with app.state.engine.begin() as conn:
        await conn.execute(
            sa.update(APIKey).where(APIKey.prefix == secret[:11]).values(revoked_at=utcnow())
        )
    clock.now += key_service.KEY_CACHE_TTL_S - 0.5
    assert (await client.get(SLOS, headers=bearer(secret))).status_code == 200
    clock.now += 0.5
    response = await client.get(SLOS, headers=bearer(secret))
    assert response.status_code == 401
    assert response.json() == UNKNOWN


async def test_an_unknown_key_with_a_live_prefix_is_refused(
    app: FastAPI, client: httpx.AsyncClient, make_key: MakeKey
) -> None:
    secret = await make_key(KeyRole.VIEWER)
    assert (await client.get(SLOS, headers=bearer(secret))).status_code == 200
    forged = secret[:11] + key_service.generate_key()[11:]
    response = await client.get(SLOS, headers=bearer(forged))
    assert response.status_code == 401
    assert response.json() == UNKNOWN
