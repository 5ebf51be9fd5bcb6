"""What admission does with a request an SLO can never serve in time (``slo.infeasible``).

``admit`` (the default, and the value every existing SLO gets) or ``reject``: a VARCHAR(16)
with a named CHECK, as the enums of 0001. The column goes through ``batch_alter_table`` so
it runs on SQLite too.

Revision ID: 0007_slo_infeasible
Revises: 0006_leader_lease
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_slo_infeasible"
down_revision: str | None = "0006_leader_lease"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("slo") as batch:
        batch.add_column(
            sa.Column("infeasible", sa.String(16), nullable=False, server_default="admit")
        )
        batch.create_check_constraint(
            op.f("ck_slo_infeasible_action"), "infeasible IN ('admit', 'reject')"
        )


def downgrade() -> None:
    with op.batch_alter_table("slo") as batch:
        batch.drop_constraint(op.f("ck_slo_infeasible_action"), type_="check")
        batch.drop_column("infeasible")
