"""Audit-log writes (inside the mutation's own transaction) and reads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db import utcnow
from controlplane.models import AuditLog

__all__ = ["AuditFilter", "list_entries", "record"]


async def record(
    session: AsyncSession,
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    now: datetime | None = None,
) -> AuditLog:
    """Add one audit entry to the session (committed, or rolled back, with the mutation).

    ``before``/``after`` are JSON-ready public forms of the object (never secrets).
    """
    entry = AuditLog(
        time=now or utcnow(),
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        before=before,
        after=after,
    )
    session.add(entry)
    return entry


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Entries matching every given field; ``actor`` matches as a prefix (``key:<id>``)."""

    actor: str | None = None
    action: str | None = None
    target_type: str | None = None
    target_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None


async def list_entries(
    session: AsyncSession, where: AuditFilter, *, limit: int, offset: int
) -> tuple[list[AuditLog], int]:
    """One page of entries, newest first, and the number matching."""
    conditions: list[sa.ColumnElement[bool]] = []
    if where.actor is not None:
        conditions.append(AuditLog.actor.startswith(where.actor, autoescape=True))
    if where.action is not None:
        conditions.append(AuditLog.action == where.action)
    if where.target_type is not None:
        conditions.append(AuditLog.target_type == where.target_type)
    if where.target_id is not None:
        conditions.append(AuditLog.target_id == where.target_id)
    if where.since is not None:
        conditions.append(AuditLog.time >= where.since)
    if where.until is not None:
        conditions.append(AuditLog.time < where.until)
    count = await session.scalar(
        sa.select(sa.func.count()).select_from(AuditLog).where(*conditions)
    )
    rows = await session.scalars(
        sa.select(AuditLog)
        .where(*conditions)
        .order_by(AuditLog.time.desc(), AuditLog.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return list(rows), int(count or 0)
