"""Automation state: whether the planner may act, operators' role pins, and role moves
(one instance's change of pool, with the commands that carry it out)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime, UUIDString, utcnow
from controlplane.models.enums import MoveState, PoolRole, enum_type
from controlplane.models.types import JSONDoc

__all__ = ["Automation", "RoleMove", "RolePin"]


class Automation(Base):
    """One control loop's switch (``name`` ``"planner"``): ``paused`` loops issue nothing.
    No row means running."""

    __tablename__ = "automation"

    name: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    paused: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    reason: Mapped[str] = mapped_column(sa.Text, default="")
    updated_by: Mapped[str] = mapped_column(sa.String(300), default="")
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RolePin(Base):
    """An operator fixed a fleet member's role: the planner never moves it."""

    __tablename__ = "role_pin"

    member_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("fleet_member.id", ondelete="CASCADE"), primary_key=True
    )
    role: Mapped[PoolRole] = mapped_column(enum_type(PoolRole, "role"))
    reason: Mapped[str] = mapped_column(sa.Text, default="")
    actor: Mapped[str] = mapped_column(sa.String(300))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RoleMove(Base):
    """A planned change of ``member_id``'s pool: ``draining`` (``drain`` sent) →
    ``switching`` (``set_role`` and ``resume`` sent) → ``done``, or ``failed`` /
    ``cancelled``. ``evidence`` and ``predicted_effect`` are the planner's; after
    ``observe_at`` the observed effect is recorded beside them."""

    __tablename__ = "role_move"
    __table_args__ = (sa.Index("ix_role_move_state", "state"),)

    id: Mapped[uuid.UUID] = mapped_column(UUIDString, primary_key=True, default=uuid.uuid4)
    member_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("fleet_member.id", ondelete="CASCADE"), index=True
    )
    from_role: Mapped[PoolRole] = mapped_column(enum_type(PoolRole, "from_role"))
    to_role: Mapped[PoolRole] = mapped_column(enum_type(PoolRole, "to_role"))
    mode: Mapped[str] = mapped_column(sa.String(16))
    source: Mapped[str] = mapped_column(sa.String(300))
    state: Mapped[MoveState] = mapped_column(enum_type(MoveState, "state"))
    evidence: Mapped[dict[str, Any]] = mapped_column(JSONDoc, default=dict)
    predicted_effect: Mapped[dict[str, Any]] = mapped_column(JSONDoc, default=dict)
    observed_effect: Mapped[dict[str, Any] | None] = mapped_column(JSONDoc, default=None)
    detail: Mapped[str] = mapped_column(sa.Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    observe_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
