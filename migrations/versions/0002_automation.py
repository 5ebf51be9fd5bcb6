"""Automation: the planner's pause switch, operators' role pins, role moves, and the move a
command carries out (``command.move_id``).

Types spelled out as in 0001 (CHAR(36) UUIDs, timezone-aware DATETIME, JSONB/JSON, enums as
VARCHAR(16) with a named CHECK). The new command column goes through ``batch_alter_table``
so it runs on SQLite too.

Revision ID: 0002_automation
Revises: 0001_initial
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002_automation"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UUID = sa.CHAR(36)
TIME = sa.DateTime(timezone=True)
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
ROLES = ("prefill", "decode", "both")
MOVE_STATES = ("draining", "switching", "done", "failed", "cancelled")


def _enum(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=16)


def upgrade() -> None:
    op.create_table(
        "automation",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("updated_by", sa.String(300), nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_automation")),
    )
    op.create_table(
        "role_pin",
        sa.Column("member_id", sa.String(128), nullable=False),
        sa.Column("role", _enum("role", *ROLES), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("actor", sa.String(300), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["member_id"],
            ["fleet_member.id"],
            name=op.f("fk_role_pin_member_id_fleet_member"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("member_id", name=op.f("pk_role_pin")),
    )
    op.create_table(
        "role_move",
        sa.Column("id", UUID, nullable=False),
        sa.Column("member_id", sa.String(128), nullable=False),
        sa.Column("from_role", _enum("from_role", *ROLES), nullable=False),
        sa.Column("to_role", _enum("to_role", *ROLES), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("source", sa.String(300), nullable=False),
        sa.Column("state", _enum("state", *MOVE_STATES), nullable=False),
        sa.Column("evidence", JSON_DOC, nullable=False),
        sa.Column("predicted_effect", JSON_DOC, nullable=False),
        sa.Column("observed_effect", JSON_DOC, nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.Column("observe_at", TIME, nullable=True),
        sa.ForeignKeyConstraint(
            ["member_id"],
            ["fleet_member.id"],
            name=op.f("fk_role_move_member_id_fleet_member"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_role_move")),
    )
    op.create_index("ix_role_move_state", "role_move", ["state"])
    op.create_index(op.f("ix_role_move_member_id"), "role_move", ["member_id"])
    with op.batch_alter_table("command") as batch:
        batch.add_column(sa.Column("move_id", UUID, nullable=True))
        batch.create_foreign_key(
            op.f("fk_command_move_id_role_move"),
            "role_move",
            ["move_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.create_index(op.f("ix_command_move_id"), ["move_id"])


def downgrade() -> None:
    with op.batch_alter_table("command") as batch:
        batch.drop_index(op.f("ix_command_move_id"))
        batch.drop_constraint(op.f("fk_command_move_id_role_move"), type_="foreignkey")
        batch.drop_column("move_id")
    op.drop_table("role_move")
    op.drop_table("role_pin")
    op.drop_table("automation")
