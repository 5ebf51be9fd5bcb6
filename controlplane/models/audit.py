"""The audit log: one row per mutation, written in the mutation's own transaction."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime, UUIDString, utcnow
from controlplane.models.types import JSONDoc

__all__ = ["AuditLog"]


class AuditLog(Base):
    """Who (``actor``: ``key:<id>:<name>`` or ``cli``) did what (``action``, e.g.
    ``slo.update``) to which object (``target_type``, ``target_id``), with the object's
    public form before and after (``None`` for a create's before and a hard delete's after).
    """

    __tablename__ = "audit_log"
    __table_args__ = (sa.Index("ix_audit_log_target", "target_type", "target_id"),)

    id: Mapped[uuid.UUID] = mapped_column(UUIDString, primary_key=True, default=uuid.uuid4)
    time: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(sa.String(300), index=True)
    action: Mapped[str] = mapped_column(sa.String(64))
    target_type: Mapped[str] = mapped_column(sa.String(32))
    target_id: Mapped[str] = mapped_column(sa.String(200))
    before: Mapped[dict[str, Any] | None] = mapped_column(JSONDoc, default=None)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSONDoc, default=None)
