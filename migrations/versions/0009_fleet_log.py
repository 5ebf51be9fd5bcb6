"""The fleet's shared ingest log (``goodput_fleet_log``, docs/scale-out.md).

Control-plane replicas started with ``GOODPUT_FLEET_INGEST`` append each batch they accept
to this table and acknowledge it once committed; every replica applies every row, in the
order of ``txid`` (the inserting transaction's id), to its own goodput engine. The table
is created on SQLite too (one schema for both), where nothing writes it: the fleet mode
needs PostgreSQL.

Revision ID: 0009_fleet_log
Revises: 0008_rollup_classes_vantages
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_fleet_log"
down_revision: str | None = "0008_rollup_classes_vantages"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "goodput_fleet_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("txid", sa.BigInteger(), nullable=False),
        sa.Column("origin", sa.String(255), nullable=False),
        sa.Column("max_finish_minute", sa.BigInteger(), nullable=False),
        sa.Column("entry", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_goodput_fleet_log_txid", "goodput_fleet_log", ["txid"])
    if op.get_bind().dialect.name == "postgresql":
        # Entries are compressed wire bodies: TOAST's pglz gains 4 % on them and cost the
        # insert three quarters of its throughput (31 against 132 MB/s measured here).
        op.execute("ALTER TABLE goodput_fleet_log ALTER COLUMN entry SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_index("ix_goodput_fleet_log_txid", table_name="goodput_fleet_log")
    op.drop_table("goodput_fleet_log")
