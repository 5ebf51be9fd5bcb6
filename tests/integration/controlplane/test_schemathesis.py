"""Property-based API tests from the OpenAPI schema (schemathesis), with an admin key:
no 5xx, every response conforms to the schema (status codes, content types, bodies), schema-
invalid input is rejected and schema-valid input is accepted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import schemathesis
import sqlalchemy as sa
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.python.asgi import shutdown_lifespans

from controlplane.db import create_engine_for, session_factory, sync_url, utcnow
from controlplane.main import create_app
from controlplane.models import Base, Role
from controlplane.services import keys as key_service
from controlplane.settings import Settings

pytestmark = pytest.mark.integration


async def _mint_admin_key(database_url: str) -> str:
    engine = create_engine_for(database_url)
    try:
        async with session_factory(engine)() as session, session.begin():
            _, key = await key_service.create_key(
                session,
                name="schemathesis",
                role=Role.ADMIN,
                tenant=None,
                actor="cli",
                now=utcnow(),
            )
        return key
    finally:
        await engine.dispose()


@pytest.fixture(scope="module")
def admin_key(postgresql_url: str) -> Iterator[str]:
    yield asyncio.run(_mint_admin_key(postgresql_url))
    shutdown_lifespans()
    engine = sa.create_engine(sync_url(postgresql_url))
    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()


@pytest.fixture(scope="module")
def app(postgresql_url: str) -> FastAPI:
    # PostgreSQL: the stricter backend (it refuses NUL characters, overlong values, ...).
    return create_app(Settings(database_url=postgresql_url))


# The schema comes from create_app's OpenAPI document, without starting an app (its lifespan
# needs a migrated database); every case is sent to the PostgreSQL-backed app fixture above.
# (schemathesis.pytest.from_fixture would be the lazy alternative; it breaks on pytest 9.)
_schema_app = create_app(Settings(database_url="sqlite:///:memory:"))
schema = schemathesis.openapi.from_dict(_schema_app.openapi())
schema.app = _schema_app  # marks the schema as ASGI; calls pass the real app
schema.location = "/openapi.json"
# The registry's resources (their owners test ingest, OTLP, goodput and /metrics routes).
REGISTRY_TAGS = ["health", "slos", "keys", "audit", "fleet"]


@schema.include(tag=REGISTRY_TAGS).parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: schemathesis.Case, app: FastAPI, admin_key: str) -> None:
    case.call_and_validate(app=app, headers={"Authorization": f"Bearer {admin_key}"})
