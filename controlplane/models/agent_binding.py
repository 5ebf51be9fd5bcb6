"""Which agent key acts for which fleet member (``agent_binding``)."""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime, UUIDString, utcnow

__all__ = ["AgentBinding"]


class AgentBinding(Base):
    """Fleet member ``member_id`` is registered by the agent key ``key_id``: only that key
    (or an admin key) may register it again, beat for it, poll and ack its commands.

    Bound at the first registration (or, for a member registered before bindings existed,
    at the key's first call for it); gone with the member or the key.
    """

    __tablename__ = "agent_binding"

    member_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("fleet_member.id", ondelete="CASCADE"), primary_key=True
    )
    key_id: Mapped[uuid.UUID] = mapped_column(
        UUIDString, sa.ForeignKey("api_key.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
