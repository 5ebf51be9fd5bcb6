"""SLO definitions and their immutable version history."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.db import Base, UTCDateTime, UUIDString, utcnow
from controlplane.models.enums import SLOVantage, enum_type
from controlplane.models.types import JSONDoc

__all__ = ["SLO", "SLOVersion"]


class SLO(Base):
    """One service-level objective.

    ``selector`` maps request label keys (``exporters.records.LABEL_KEYS``) to values;
    ``objectives`` is a list of ``{"metric", "threshold_s", "statistic"}`` objects. Names are
    unique among live SLOs only: a soft-deleted SLO keeps its id, history and rollups, and its
    name can be used again by a new SLO (new id, version 1).
    """

    __tablename__ = "slo"
    __table_args__ = (
        sa.CheckConstraint("target > 0 AND target < 1", name="target_range"),
        sa.CheckConstraint(
            "availability_target IS NULL OR (availability_target > 0 AND availability_target < 1)",
            name="availability_target_range",
        ),
        sa.CheckConstraint("window_s > 0", name="window_positive"),
        sa.CheckConstraint("infeasible IN ('admit', 'reject')", name="infeasible_action"),
        sa.CheckConstraint("version >= 1", name="version_positive"),
        # Unique among live rows only: re-creating a deleted name makes a new SLO.
        sa.Index(
            "uq_slo_name_live",
            "name",
            unique=True,
            postgresql_where=sa.text("deleted_at IS NULL"),
            sqlite_where=sa.text("deleted_at IS NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUIDString, primary_key=True, default=uuid.uuid4)
    name: Mapped[str] = mapped_column(sa.String(200))
    description: Mapped[str] = mapped_column(sa.Text, default="")
    selector: Mapped[dict[str, str]] = mapped_column(JSONDoc, default=dict)
    objectives: Mapped[list[dict[str, Any]]] = mapped_column(JSONDoc)
    target: Mapped[float] = mapped_column(sa.Float)
    window_s: Mapped[int] = mapped_column(sa.Integer)
    vantage: Mapped[SLOVantage] = mapped_column(
        enum_type(SLOVantage, "vantage"), default=SLOVantage.GATEWAY
    )
    availability_target: Mapped[float | None] = mapped_column(sa.Float, default=None)
    #: What admission does with a request it predicts can never meet the TTFT objective,
    #: even on an idle instance: ``admit`` (best effort, counted apart) or ``reject``.
    infeasible: Mapped[str] = mapped_column(sa.String(16), default="admit", server_default="admit")
    version: Mapped[int] = mapped_column(sa.Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, default=None)

    versions: Mapped[list[SLOVersion]] = relationship(
        back_populates="slo", lazy="raise", order_by="SLOVersion.version", passive_deletes=True
    )


class SLOVersion(Base):
    """The full snapshot of an SLO after one create, update or delete (never modified)."""

    __tablename__ = "slo_version"

    slo_id: Mapped[uuid.UUID] = mapped_column(
        UUIDString, sa.ForeignKey("slo.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    snapshot: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    actor: Mapped[str] = mapped_column(sa.String(300))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    slo: Mapped[SLO] = relationship(back_populates="versions", lazy="raise")
