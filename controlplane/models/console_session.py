"""Console sign-in sessions: an API key exchanged for a cookie (``controlplane.api.sessions``).

Only a hash of the session token is stored, as for keys. A session lives until it expires,
its owner signs out, or its key is revoked (checked on every request).
"""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime, UUIDString, utcnow

__all__ = ["ConsoleSession"]


class ConsoleSession(Base):
    """``token_hash``: hex SHA-256 of the cookie's token; ``csrf_token``: what the console
    sends back in ``X-CSRF-Token`` on every mutation (the double-submit check)."""

    __tablename__ = "console_session"

    token_hash: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    key_id: Mapped[uuid.UUID] = mapped_column(
        UUIDString, sa.ForeignKey("api_key.id", ondelete="CASCADE"), index=True
    )
    csrf_token: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
