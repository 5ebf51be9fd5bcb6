"""Per-minute goodput rollups written by the engine (the long-window history of an SLO)."""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db import Base, UTCDateTime, UUIDString
from controlplane.models.types import JSONDoc

__all__ = ["FleetLogEntry", "GoodputRollup", "WalCheckpoint"]


class GoodputRollup(Base):
    """Counts for one SLO over one UTC minute (``minute_start`` is minute-aligned).

    ``violations`` maps an objective key (e.g. ``"ttft"``, ``"itl:p99"``) to how many requests
    broke it; ``sketch_blob`` is the engine's serialised latency sketch, opaque here.
    ``rejected_by_class`` maps a priority class to its rejections; ``other_sketch_blob``
    holds the sketches of the other vantage in ``sketch_blob``'s encoding; both read as
    none when empty or ``NULL`` (rows from before revision 0008). ``vantage`` is the SLO's
    vantage when the row was written (``NULL``: unknown, read as the SLO's current one).
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
    rejected_by_class: Mapped[dict[str, int] | None] = mapped_column(JSONDoc, nullable=True)
    other_sketch_blob: Mapped[bytes | None] = mapped_column(sa.LargeBinary, nullable=True)
    vantage: Mapped[str | None] = mapped_column(sa.String(16), nullable=True)


class WalCheckpoint(Base):
    """How far the stored rollups cover the ingest write-ahead log (one row, ``id`` 1).

    Written in the same transaction as the rollups it describes: segments up to ``segment``
    of log ``epoch`` are covered except for records finishing at or after minute
    ``covered_until_minute`` (Unix minutes); ``dedup`` is the de-duplication state at that
    cut (``controlplane.ingest.dedup``), so a restart neither counts twice nor forgets
    which batches it acknowledged. See docs/goodput-engine.md, *Durability*.
    """

    __tablename__ = "goodput_wal_checkpoint"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    epoch: Mapped[str] = mapped_column(sa.String(32))
    segment: Mapped[int] = mapped_column(sa.BigInteger)
    covered_until_minute: Mapped[int] = mapped_column(sa.BigInteger)
    dedup: Mapped[bytes] = mapped_column(sa.LargeBinary, default=b"")


class FleetLogEntry(Base):
    """One accepted ingest batch in the fleet's shared log (docs/scale-out.md).

    Replicas sharing one PostgreSQL database with ``GOODPUT_FLEET_INGEST`` append every
    batch they accept (``entry``: the write-ahead log's entry, ``controlplane.ingest.replay``)
    and acknowledge it once the row is committed; every replica applies every row, in
    ``txid`` order, to its engine. ``txid`` is the inserting transaction's id
    (``pg_current_xact_id()``), ``origin`` the replica that took the batch,
    ``max_finish_minute`` its records' latest finish minute (what decides when a checkpoint
    covers the row and it is deleted).
    """

    __tablename__ = "goodput_fleet_log"
    __table_args__ = (sa.Index("ix_goodput_fleet_log_txid", "txid"),)

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    txid: Mapped[int] = mapped_column(sa.BigInteger)
    origin: Mapped[str] = mapped_column(sa.String(255))
    max_finish_minute: Mapped[int] = mapped_column(sa.BigInteger)
    entry: Mapped[bytes] = mapped_column(sa.LargeBinary)
