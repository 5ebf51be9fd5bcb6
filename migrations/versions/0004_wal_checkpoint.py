"""The ingest write-ahead log's checkpoint (``goodput_wal_checkpoint``), one row.

Revision ID: 0004_wal_checkpoint
Revises: 0003_console_session
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_wal_checkpoint"
down_revision: str | None = "0003_console_session"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "goodput_wal_checkpoint",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.String(32), nullable=False),
        sa.Column("segment", sa.BigInteger(), nullable=False),
        sa.Column("covered_until_minute", sa.BigInteger(), nullable=False),
        sa.Column("dedup", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_goodput_wal_checkpoint")),
    )


def downgrade() -> None:
    op.drop_table("goodput_wal_checkpoint")
