"""The declarative base (with a constraint naming convention, so migrations are stable on
PostgreSQL and SQLite alike) and the engine/session factories."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import MetaData, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import CHAR, DateTime, TypeDecorator

__all__ = [
    "NAMING_CONVENTION",
    "POOL_RECYCLE_S",
    "Base",
    "UTCDateTime",
    "UUIDString",
    "async_url",
    "create_engine_for",
    "ensure_sqlite_folder",
    "session_factory",
    "sync_url",
    "utcnow",
]

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: Goodput stores UTC-aware datetimes")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class UUIDString(TypeDecorator[uuid.UUID]):
    """UUIDs stored as 36-character strings: identical on PostgreSQL and SQLite."""

    impl = CHAR(36)
    cache_ok = True

    def process_bind_param(self, value: uuid.UUID | str | None, dialect: object) -> str | None:
        return None if value is None else str(uuid.UUID(str(value)))

    def process_result_value(self, value: str | None, dialect: object) -> uuid.UUID | None:
        return None if value is None else uuid.UUID(value)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def async_url(url: str) -> str:
    """The async-driver form of a database URL (psycopg 3 serves both; aiosqlite for SQLite)."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite://") and not url.startswith("sqlite+aiosqlite://"):
        return "sqlite+aiosqlite://" + url.removeprefix("sqlite://")
    return url


def sync_url(url: str) -> str:
    """The blocking-driver form of a database URL (for Alembic and one-shot CLI work)."""
    if url.startswith("sqlite+aiosqlite://"):
        return "sqlite://" + url.removeprefix("sqlite+aiosqlite://")
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return url


def ensure_sqlite_folder(url: str) -> None:
    """Create the folder of a SQLite database file (the embedded default lives in ``./var``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: object, _record: object) -> None:
        cursor = dbapi_conn.cursor()  # type: ignore[attr-defined]
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()


#: Pooled connections are replaced after this many seconds (before a server, proxy or
#: firewall idle timeout closes them under the pool).
POOL_RECYCLE_S = 300


def create_engine_for(url: str, *, echo: bool = False) -> AsyncEngine:
    """The app's engine for ``url``. A connection is not pinged at each checkout (that was a
    round trip per session, a third of a cached read's cost): connections are recycled
    after :data:`POOL_RECYCLE_S`, and one that the server dropped (a restart, a failover)
    fails the statement that meets it with a disconnect error, on which SQLAlchemy
    discards it and every connection pooled before it. That one statement's request
    answers 503 with ``Retry-After`` (the loops retry on their next tick); the next
    checkout connects afresh."""
    ensure_sqlite_folder(url)
    engine = create_async_engine(async_url(url), echo=echo, pool_recycle=POOL_RECYCLE_S)
    if engine.dialect.name == "sqlite":
        _sqlite_pragmas(engine.sync_engine)
    return engine


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
