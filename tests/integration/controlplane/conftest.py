"""Fixtures for control-plane integration tests, on the real PostgreSQL and on a SQLite file.

- ``database_url`` (session, parametrised ``sqlite`` / ``postgresql``): a database migrated
  once with ``alembic upgrade head``. PostgreSQL tests run in a schema of their own
  (``gp_test_<pid>_<hex>`` in database ``test``, via ``search_path``), dropped at session end,
  so concurrent test runs and other test files never see our tables.
- ``app`` (per test): ``create_app`` on that database with its lifespan entered; all tables
  are emptied after the test (the app opens several sessions per request — auth and the
  request's unit of work — so a wrapping transaction could not isolate tests).
- ``client``: an ``httpx.AsyncClient`` on the app through ``ASGITransport``.
- ``make_key(role, tenant=None) -> str`` and ``admin_headers``: API keys minted directly
  through the service.

``GOODPUT_TEST_PG_URL`` overrides the PostgreSQL server (default: root@127.0.0.1:5432/test).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest
import pytest_asyncio
import sqlalchemy as sa
from fastapi import FastAPI

from controlplane.db import utcnow
from controlplane.main import create_app
from controlplane.models import Base, KeyRole
from controlplane.services import keys as key_service
from controlplane.settings import Settings
from migrations import upgrade

PG_URL = os.environ.get("GOODPUT_TEST_PG_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
BACKENDS = ("sqlite", "postgresql")

MakeKey = Callable[..., Awaitable[str]]


def _libpq_dsn(url: str) -> str:
    parsed = sa.make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def schema_url(schema: str) -> str:
    """PG_URL with every connection's search_path set to ``schema``."""
    return f"{PG_URL}?options={quote(f'-csearch_path={schema}')}"


def create_schema() -> str:
    schema = f"gp_test_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(_libpq_dsn(PG_URL), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return schema


def drop_schema(schema: str) -> None:
    with psycopg.connect(_libpq_dsn(PG_URL), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(scope="session")
def postgresql_url() -> Iterator[str]:
    schema = create_schema()
    try:
        url = schema_url(schema)
        upgrade(url)
        yield url
    finally:
        drop_schema(schema)


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path: Path = tmp_path_factory.mktemp("controlplane") / "goodput.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    return url


@pytest.fixture(scope="session", params=BACKENDS)
def database_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url)


async def empty_tables(app: FastAPI) -> None:
    async with app.state.engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            await conn.execute(table.delete())


@pytest_asyncio.fixture(loop_scope="function")
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        try:
            yield application
        finally:
            await empty_tables(application)


@pytest_asyncio.fixture(loop_scope="function")
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
        yield http


@pytest.fixture
def make_key(app: FastAPI) -> MakeKey:
    async def make(role: KeyRole | str, tenant: str | None = None, name: str = "") -> str:
        role = KeyRole(role)
        async with app.state.sessions() as session, session.begin():
            _, secret = await key_service.create_key(
                session,
                name=name or f"test-{role.value}",
                role=role,
                tenant=tenant,
                actor="cli",
                now=utcnow(),
            )
        return secret

    return make


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest_asyncio.fixture(loop_scope="function")
async def admin_headers(make_key: MakeKey) -> dict[str, str]:
    return bearer(await make_key(KeyRole.ADMIN, name="test-admin"))


@pytest_asyncio.fixture(loop_scope="function")
async def operator_headers(make_key: MakeKey) -> dict[str, str]:
    return bearer(await make_key(KeyRole.OPERATOR, name="test-operator"))


@pytest_asyncio.fixture(loop_scope="function")
async def viewer_headers(make_key: MakeKey) -> dict[str, str]:
    return bearer(await make_key(KeyRole.VIEWER, name="test-viewer"))
