"""Agent keys bound to the fleet members they registered (``agent_binding``).

Revision ID: 0005_agent_binding
Revises: 0004_wal_checkpoint
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_agent_binding"
down_revision: str | None = "0004_wal_checkpoint"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agent_binding",
        sa.Column("member_id", sa.String(128), nullable=False),
        sa.Column("key_id", sa.CHAR(36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["member_id"],
            ["fleet_member.id"],
            name=op.f("fk_agent_binding_member_id_fleet_member"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["key_id"],
            ["api_key.id"],
            name=op.f("fk_agent_binding_key_id_api_key"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("member_id", name=op.f("pk_agent_binding")),
    )
    op.create_index(op.f("ix_agent_binding_key_id"), "agent_binding", ["key_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_agent_binding_key_id"), table_name="agent_binding")
    op.drop_table("agent_binding")
