"""/health and /ready: ready means the database answers and has the schema this code needs."""

from __future__ import annotations

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from controlplane.db import create_engine_for
from controlplane.models import SCHEMA_REVISION

pytestmark = pytest.mark.integration


async def test_ready_names_backend_and_revision(app: FastAPI, client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).json() == {"status": "ok"}
    response = await client.get("/ready")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ready",
        "database": app.state.engine.dialect.name,
        "schema_revision": SCHEMA_REVISION,
    }


async def test_not_ready_at_another_schema_revision(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    async with app.state.engine.begin() as conn:
        await conn.execute(sa.text("UPDATE alembic_version SET version_num = '0000_old'"))
    try:
        response = await client.get("/ready")
    finally:
        async with app.state.engine.begin() as conn:
            await conn.execute(
                sa.text(f"UPDATE alembic_version SET version_num = '{SCHEMA_REVISION}'")
            )
    assert response.status_code == 503
    assert response.json() == {
        "detail": "not ready: database schema is at revision '0000_old', this control plane "
        f"needs '{SCHEMA_REVISION}'; run `goodput db upgrade`"
    }


async def test_not_ready_when_the_database_is_unreachable(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    working = app.state.engine
    app.state.engine = create_engine_for("postgresql+psycopg://root@127.0.0.1:1/test")
    try:
        response = await client.get("/ready")
        health = await client.get("/health")
    finally:
        await app.state.engine.dispose()
        app.state.engine = working
    assert response.status_code == 503
    # The kind only: the driver's message names the host and port, and /ready is open.
    assert response.json()["detail"] == "not ready: database unreachable (OperationalError)"
    assert health.status_code == 200
