"""Audit-log wire models."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["AuditEntriesPublic", "AuditEntryPublic"]


class AuditEntryPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    time: datetime
    actor: str
    action: str
    target_type: str
    target_id: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


class AuditEntriesPublic(BaseModel):
    data: list[AuditEntryPublic]
    count: int
