"""The fleet (gateways and workers that registered) and the commands sent to them."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.db import Base, UTCDateTime, UUIDString, utcnow
from controlplane.models.enums import CommandState, FleetKind, FleetState, PoolRole, enum_type
from controlplane.models.types import JSONDoc

__all__ = ["Command", "FleetMember"]


class FleetMember(Base):
    """A gateway or worker, identified by the id its agent chose; ``load`` is the latest
    heartbeat's load report (opaque to the registry, read by the planner). ``tenant``: the
    tenant whose pool it serves, as its agent registered it (``None``: the cluster's, shared);
    a tenant-scoped key reaches only its tenant's members (docs/api.md)."""

    __tablename__ = "fleet_member"

    id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    kind: Mapped[FleetKind] = mapped_column(enum_type(FleetKind, "kind"))
    endpoint: Mapped[str] = mapped_column(sa.String(500))
    model: Mapped[str] = mapped_column(sa.String(200), default="")
    role: Mapped[PoolRole] = mapped_column(enum_type(PoolRole, "role"), default=PoolRole.BOTH)
    state: Mapped[FleetState] = mapped_column(
        enum_type(FleetState, "state"), default=FleetState.STARTING
    )
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    load: Mapped[dict[str, Any]] = mapped_column(JSONDoc, default=dict)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    tenant: Mapped[str | None] = mapped_column(sa.String(200), default=None, index=True)

    commands: Mapped[list[Command]] = relationship(
        back_populates="member", lazy="raise", passive_deletes=True
    )


class Command(Base):
    """An instruction for one fleet member. ``id`` doubles as the idempotency key: the agent
    acknowledges by id, and re-delivery of the same id must be harmless. ``version`` guards
    concurrent state changes (compare-and-set on update)."""

    __tablename__ = "command"
    __table_args__ = (
        sa.Index("ix_command_target_state", "target", "state"),
        sa.CheckConstraint("attempts >= 0", name="attempts_non_negative"),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDString, primary_key=True, default=uuid.uuid4)
    target: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("fleet_member.id", ondelete="CASCADE")
    )
    kind: Mapped[str] = mapped_column(sa.String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONDoc, default=dict)
    state: Mapped[CommandState] = mapped_column(
        enum_type(CommandState, "state"), default=CommandState.PENDING
    )
    evidence: Mapped[dict[str, Any] | None] = mapped_column(JSONDoc, default=None)
    predicted_effect: Mapped[dict[str, Any] | None] = mapped_column(JSONDoc, default=None)
    observed_effect: Mapped[dict[str, Any] | None] = mapped_column(JSONDoc, default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    acked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0)
    version: Mapped[int] = mapped_column(sa.Integer, default=1)
    # The role move this command carries out (planner and manual moves), if any.
    move_id: Mapped[uuid.UUID | None] = mapped_column(
        UUIDString, sa.ForeignKey("role_move.id", ondelete="SET NULL"), default=None, index=True
    )

    member: Mapped[FleetMember] = relationship(back_populates="commands", lazy="raise")
