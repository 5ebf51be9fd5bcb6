"""Initial registry schema: SLOs and their versions, API keys, audit log, fleet, commands,
per-minute goodput rollups.

Reviewed by hand from autogenerate. Types are spelled out here rather than imported from
the models, so this revision stays what it was when the models change:
``UUIDString`` is CHAR(36), ``UTCDateTime`` is a timezone-aware DATETIME, ``JSONDoc`` is
JSONB on PostgreSQL and JSON on SQLite, and enums are VARCHAR(16) with a named CHECK.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UUID = sa.CHAR(36)
TIME = sa.DateTime(timezone=True)
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _enum(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=16)


def upgrade() -> None:
    op.create_table(
        "api_key",
        sa.Column("id", UUID, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column(
            "role", _enum("role", "viewer", "operator", "admin", "ingest", "agent"), nullable=False
        ),
        sa.Column("tenant", sa.String(200), nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("last_used_at", TIME, nullable=True),
        sa.Column("revoked_at", TIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_key")),
        sa.UniqueConstraint("hash", name=op.f("uq_api_key_hash")),
    )
    op.create_index(op.f("ix_api_key_prefix"), "api_key", ["prefix"])

    op.create_table(
        "audit_log",
        sa.Column("id", UUID, nullable=False),
        sa.Column("time", TIME, nullable=False),
        sa.Column("actor", sa.String(300), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target_type", sa.String(32), nullable=False),
        sa.Column("target_id", sa.String(200), nullable=False),
        sa.Column("before", JSON_DOC, nullable=True),
        sa.Column("after", JSON_DOC, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_actor"), "audit_log", ["actor"])
    op.create_index("ix_audit_log_target", "audit_log", ["target_type", "target_id"])
    op.create_index(op.f("ix_audit_log_time"), "audit_log", ["time"])

    op.create_table(
        "fleet_member",
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("kind", _enum("kind", "gateway", "worker"), nullable=False),
        sa.Column("endpoint", sa.String(500), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("role", _enum("role", "prefill", "decode", "both"), nullable=False),
        sa.Column(
            "state",
            _enum("state", "starting", "ready", "draining", "drained", "down"),
            nullable=False,
        ),
        sa.Column("last_heartbeat_at", TIME, nullable=True),
        sa.Column("load", JSON_DOC, nullable=False),
        sa.Column("registered_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fleet_member")),
    )

    op.create_table(
        "slo",
        sa.Column("id", UUID, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("selector", JSON_DOC, nullable=False),
        sa.Column("objectives", JSON_DOC, nullable=False),
        sa.Column("target", sa.Float(), nullable=False),
        sa.Column("window_s", sa.Integer(), nullable=False),
        sa.Column("vantage", _enum("vantage", "gateway", "engine"), nullable=False),
        sa.Column("availability_target", sa.Float(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.Column("deleted_at", TIME, nullable=True),
        sa.CheckConstraint(
            "availability_target IS NULL OR (availability_target > 0 AND availability_target < 1)",
            name=op.f("ck_slo_availability_target_range"),
        ),
        sa.CheckConstraint("target > 0 AND target < 1", name=op.f("ck_slo_target_range")),
        sa.CheckConstraint("version >= 1", name=op.f("ck_slo_version_positive")),
        sa.CheckConstraint("window_s > 0", name=op.f("ck_slo_window_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_slo")),
    )
    # Names are unique among live SLOs only (soft-deleted rows keep theirs).
    op.create_index(
        "uq_slo_name_live",
        "slo",
        ["name"],
        unique=True,
        postgresql_where=sa.text("deleted_at IS NULL"),
        sqlite_where=sa.text("deleted_at IS NULL"),
    )

    op.create_table(
        "command",
        sa.Column("id", UUID, nullable=False),
        sa.Column("target", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("payload", JSON_DOC, nullable=False),
        sa.Column(
            "state",
            _enum("state", "pending", "delivered", "acked", "failed", "expired"),
            nullable=False,
        ),
        sa.Column("evidence", JSON_DOC, nullable=True),
        sa.Column("predicted_effect", JSON_DOC, nullable=True),
        sa.Column("observed_effect", JSON_DOC, nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("delivered_at", TIME, nullable=True),
        sa.Column("acked_at", TIME, nullable=True),
        sa.Column("expires_at", TIME, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_command_attempts_non_negative")),
        sa.ForeignKeyConstraint(
            ["target"],
            ["fleet_member.id"],
            name=op.f("fk_command_target_fleet_member"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_command")),
    )
    op.create_index("ix_command_target_state", "command", ["target", "state"])

    op.create_table(
        "goodput_rollup",
        sa.Column("slo_id", UUID, nullable=False),
        sa.Column("minute_start", TIME, nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("good", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("aborted", sa.BigInteger(), nullable=False),
        sa.Column("rejected", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("good_output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("violations", JSON_DOC, nullable=False),
        sa.Column("sketch_blob", sa.LargeBinary(), nullable=False),
        sa.CheckConstraint("good <= requests", name=op.f("ck_goodput_rollup_good_within_requests")),
        sa.CheckConstraint(
            "requests >= 0 AND good >= 0 AND errors >= 0 AND aborted >= 0 AND rejected >= 0",
            name=op.f("ck_goodput_rollup_counts_non_negative"),
        ),
        sa.ForeignKeyConstraint(
            ["slo_id"], ["slo.id"], name=op.f("fk_goodput_rollup_slo_id_slo"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("slo_id", "minute_start", name=op.f("pk_goodput_rollup")),
    )

    op.create_table(
        "slo_version",
        sa.Column("slo_id", UUID, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("snapshot", JSON_DOC, nullable=False),
        sa.Column("actor", sa.String(300), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["slo_id"], ["slo.id"], name=op.f("fk_slo_version_slo_id_slo"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("slo_id", "version", name=op.f("pk_slo_version")),
    )


def downgrade() -> None:
    # Children before parents; dropping a table drops its indexes on both backends.
    op.drop_table("slo_version")
    op.drop_table("goodput_rollup")
    op.drop_table("command")
    op.drop_table("slo")
    op.drop_table("fleet_member")
    op.drop_table("audit_log")
    op.drop_table("api_key")
