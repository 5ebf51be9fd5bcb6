"""Console sign-in sessions (``console_session``): a hashed token per signed-in API key.

Revision ID: 0003_console_session
Revises: 0002_automation
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_console_session"
down_revision: str | None = "0002_automation"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UUID = sa.CHAR(36)
TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "console_session",
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("key_id", UUID, nullable=False),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("expires_at", TIME, nullable=False),
        sa.ForeignKeyConstraint(
            ["key_id"],
            ["api_key.id"],
            name=op.f("fk_console_session_key_id_api_key"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("token_hash", name=op.f("pk_console_session")),
    )
    op.create_index(op.f("ix_console_session_key_id"), "console_session", ["key_id"])
    op.create_index(op.f("ix_console_session_expires_at"), "console_session", ["expires_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_console_session_expires_at"), table_name="console_session")
    op.drop_index(op.f("ix_console_session_key_id"), table_name="console_session")
    op.drop_table("console_session")
