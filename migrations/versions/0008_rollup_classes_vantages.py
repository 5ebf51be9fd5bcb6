"""What a goodput minute rollup adds for the SLO detail page (``goodput_rollup``).

``rejected_by_class`` (JSON, priority class → rejections), ``other_sketch_blob`` (the other
vantage's latency sketches, in ``sketch_blob``'s encoding) and ``vantage`` (the SLO's
vantage when the row was written, VARCHAR(16)). All three are nullable: every existing row
reads as none (no class, no other-vantage sketch, the vantage unknown). The columns go
through ``batch_alter_table`` so it runs on SQLite too.

Revision ID: 0008_rollup_classes_vantages
Revises: 0007_slo_infeasible
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008_rollup_classes_vantages"
down_revision: str | None = "0007_slo_infeasible"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("goodput_rollup") as batch:
        batch.add_column(
            sa.Column(
                "rejected_by_class",
                sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                nullable=True,
            )
        )
        batch.add_column(sa.Column("other_sketch_blob", sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("vantage", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("goodput_rollup") as batch:
        batch.drop_column("vantage")
        batch.drop_column("other_sketch_blob")
        batch.drop_column("rejected_by_class")
