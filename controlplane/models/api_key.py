"""API keys: only a hash of each key is stored, never the key."""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime, UUIDString, utcnow
from controlplane.models.enums import KeyRole, enum_type

__all__ = ["APIKey"]


class APIKey(Base):
    """A bearer key: ``prefix`` is its short public head (shown in lists, used to look it up),
    ``hash`` the hex SHA-256 of the whole key. ``tenant`` scopes the key to one tenant's SLOs
    and records; ``None`` means every tenant. A revoked key stays for the audit trail.
    """

    __tablename__ = "api_key"

    id: Mapped[uuid.UUID] = mapped_column(UUIDString, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(sa.String(200))
    prefix: Mapped[str] = mapped_column(sa.String(16), index=True)
    hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    role: Mapped[KeyRole] = mapped_column(enum_type(KeyRole, "role"))
    tenant: Mapped[str | None] = mapped_column(sa.String(200), default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
