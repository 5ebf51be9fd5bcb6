"""Alembic on both backends: empty → head → base → head, and models == migrations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.orm import Session

from controlplane.db import sync_url
from controlplane.models import SCHEMA_REVISION, Base, GoodputRollup
from controlplane.services import rollups as rollup_service
from migrations import downgrade, head_revision, upgrade

from .conftest import create_schema, drop_schema, schema_url

pytestmark = pytest.mark.integration

TABLES = {
    "slo",
    "slo_version",
    "api_key",
    "audit_log",
    "console_session",
    "fleet_member",
    "command",
    "goodput_rollup",
    "goodput_wal_checkpoint",
    "agent_binding",
    "automation",
    "role_pin",
    "role_move",
    "leader_lease",
    "goodput_fleet_log",
}


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database (not the shared one the API tests use)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh' / 'goodput.db'}"
        return
    schema = create_schema()
    try:
        yield schema_url(schema)
    finally:
        drop_schema(schema)


def tables(url: str) -> set[str]:
    engine = sa.create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def diff(url: str) -> list[object]:
    engine = sa.create_engine(sync_url(url))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(empty_database: str) -> None:
    upgrade(empty_database)
    assert tables(empty_database) == TABLES
    downgrade(empty_database, "base")
    assert tables(empty_database) == set()
    upgrade(empty_database)
    assert tables(empty_database) == TABLES


def test_models_and_migrations_agree(empty_database: str) -> None:
    upgrade(empty_database)
    assert diff(empty_database) == []


def test_models_name_the_head_revision() -> None:
    assert head_revision() == SCHEMA_REVISION


def test_partial_unique_index_allows_reusing_a_deleted_name(empty_database: str) -> None:
    upgrade(empty_database)
    engine = sa.create_engine(sync_url(empty_database))
    insert = sa.text(
        "INSERT INTO slo (id, name, description, selector, objectives, target, window_s, "
        "vantage, version, created_at, updated_at, deleted_at) VALUES (:id, 'chat', '', '{}', "
        "'[]', 0.9, 60, 'gateway', 1, :t, :t, :deleted)"
    )
    when = "2026-01-01 00:00:00+00:00"
    try:
        with engine.begin() as conn:
            conn.execute(
                insert, {"id": "a" * 8 + "-0000-0000-0000-" + "0" * 12, "t": when, "deleted": when}
            )
            conn.execute(
                insert, {"id": "b" * 8 + "-0000-0000-0000-" + "0" * 12, "t": when, "deleted": None}
            )
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(
                insert, {"id": "c" * 8 + "-0000-0000-0000-" + "0" * 12, "t": when, "deleted": None}
            )
    finally:
        engine.dispose()


def test_rollups_stored_before_0008_read_as_without_classes_or_other_vantage(
    empty_database: str,
) -> None:
    upgrade(empty_database, "0007_slo_infeasible")
    engine = sa.create_engine(sync_url(empty_database))
    slo_id = "d" * 8 + "-0000-0000-0000-" + "0" * 12
    when = "2026-01-01 00:00:00+00:00"
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO slo (id, name, description, selector, objectives, target, "
                    "window_s, vantage, version, created_at, updated_at) VALUES (:id, 'chat', "
                    "'', '{}', '[]', 0.9, 60, 'gateway', 1, :t, :t)"
                ),
                {"id": slo_id, "t": when},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO goodput_rollup (slo_id, minute_start, requests, good, errors, "
                    "aborted, rejected, output_tokens, good_output_tokens, violations, "
                    "sketch_blob) VALUES (:id, :t, 3, 2, 0, 0, 1, 6, 4, '{}', :blob)"
                ),
                {"id": slo_id, "t": when, "blob": b""},
            )
        upgrade(empty_database)
        with Session(engine) as session:
            (row,) = session.scalars(sa.select(GoodputRollup))
            rollup = rollup_service._to_rollup(row)
        assert (rollup.requests, rollup.rejected) == (3, 1)
        assert (rollup.rejected_by_class, rollup.other_sketch_blob, rollup.vantage) == ({}, b"", "")
        downgrade(empty_database, "0007_slo_infeasible")
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT rejected FROM goodput_rollup")).scalar() == 1
    finally:
        engine.dispose()
