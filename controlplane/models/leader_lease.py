"""The lease that says which control-plane replica runs the loops (``leader_lease``)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime

__all__ = ["LeaderLease"]


class LeaderLease(Base):
    """One row per lease ``name`` (``loops``: the admission and planner loops).

    ``holder`` runs the loops until ``expires_at``; it renews before then. ``epoch`` is the
    fencing token: it grows by one each time the lease changes hands, and every loop
    transaction checks, under a row lock, that it still holds the epoch it started with
    (``controlplane.runtime.leadership``).
    """

    __tablename__ = "leader_lease"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(sa.String(255))
    epoch: Mapped[int] = mapped_column(sa.BigInteger)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    acquired_at: Mapped[datetime] = mapped_column(UTCDateTime)
