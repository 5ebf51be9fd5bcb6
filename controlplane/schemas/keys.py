"""API-key wire models. The key itself appears once, in ``APIKeyCreated``."""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from controlplane.models.enums import KeyRole
from controlplane.schemas.common import Label, Name, WireModel

__all__ = ["APIKeyCreate", "APIKeyCreated", "APIKeyPublic", "APIKeysPublic"]


class APIKeyCreate(WireModel):
    """``tenant`` scopes a viewer, operator or ingest key to one tenant; admin and agent keys
    act on every tenant and take none (the schema says so with if/then; the service checks)."""

    model_config = ConfigDict(
        json_schema_extra={
            "if": {
                "properties": {"role": {"enum": [KeyRole.ADMIN.value, KeyRole.AGENT.value]}},
                "required": ["role"],
            },
            "then": {"properties": {"tenant": {"type": "null"}}},
        }
    )

    name: Name
    role: KeyRole
    tenant: Label | None = None


class APIKeyPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    name: str
    prefix: str
    role: KeyRole
    tenant: str | None
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class APIKeyCreated(APIKeyPublic):
    """The new key's record and the key itself: store it now, it is never shown again."""

    key: str


class APIKeysPublic(BaseModel):
    data: list[APIKeyPublic]
    count: int
