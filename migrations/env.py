"""Alembic environment: runs revisions on one blocking connection (psycopg 3 or sqlite3).

The URL comes from ``config.attributes["database_url"]`` (set by ``migrations.alembic_config``)
or else from the control plane's settings (``GOODPUT_DATABASE_URL``). A caller may also hand
over an open connection in ``config.attributes["connection"]`` (tests do).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool

from controlplane.db import ensure_sqlite_folder, sync_url
from controlplane.models import Base
from controlplane.settings import Settings

config = context.config
target_metadata = Base.metadata


def _database_url() -> str:
    url = config.attributes.get("database_url") or Settings().database_url
    return sync_url(str(url))


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place: batch mode copies the table instead.
        render_as_batch=True,
        compare_type=True,
        compare_server_default=True,
    )


def run_migrations_offline() -> None:
    context.configure(
        url=_database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given: Connection | None = config.attributes.get("connection")
    if given is not None:
        _configure(given)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = _database_url()
    ensure_sqlite_folder(url)
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
