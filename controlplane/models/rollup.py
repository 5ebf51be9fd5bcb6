"""Per-minute goodput rollups written by the engine (the long-window history of an SLO)."""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime, UUIDString
from controlplane.models.types import JSONDoc

__all__ = ["GoodputRollup"]


class GoodputRollup(Base):
    """Counts for one SLO over one UTC minute (``minute_start`` is minute-aligned).

    ``violations`` maps an objective key (e.g. ``"ttft"``, ``"itl:p99"``) to how many requests
    broke it; ``sketch_blob`` is the engine's serialised latency sketch, opaque here.
    """

    __tablename__ = "goodput_rollup"
    __table_args__ = (
        sa.CheckConstraint("good <= requests", name="good_within_requests"),
        sa.CheckConstraint(
            "requests >= 0 AND good >= 0 AND errors >= 0 AND aborted >= 0 AND rejected >= 0",
            name="counts_non_negative",
        ),
    )

    slo_id: Mapped[uuid.UUID] = mapped_column(
        UUIDString, sa.ForeignKey("slo.id", ondelete="CASCADE"), primary_key=True
    )
    minute_start: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    requests: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    good: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    errors: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    aborted: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    rejected: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    good_output_tokens: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    violations: Mapped[dict[str, int]] = mapped_column(JSONDoc, default=dict)
    sketch_blob: Mapped[bytes] = mapped_column(sa.LargeBinary, default=b"")
