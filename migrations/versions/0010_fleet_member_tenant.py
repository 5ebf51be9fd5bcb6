"""Fleet members may belong to a tenant (``fleet_member.tenant``, indexed).

A member registered with a ``tenant`` serves that tenant's pool: tenant-scoped keys see and
act on it (docs/api.md, "Tenant scope"). Members stored before this revision have none:
they stay the cluster's, shared, as they were.

Revision ID: 0010_fleet_member_tenant
Revises: 0009_fleet_log
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_fleet_member_tenant"
down_revision: str | None = "0009_fleet_log"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable column without a default: an in-place ALTER on SQLite and PostgreSQL alike.
    op.add_column("fleet_member", sa.Column("tenant", sa.String(200), nullable=True))
    op.create_index(op.f("ix_fleet_member_tenant"), "fleet_member", ["tenant"])


def downgrade() -> None:
    op.drop_index(op.f("ix_fleet_member_tenant"), table_name="fleet_member")
    # In place (SQLite >= 3.35 drops a column): a batch copy of fleet_member would drop the
    # old table, and with it, through ON DELETE CASCADE, every command, pin and move.
    op.drop_column("fleet_member", "tenant")
