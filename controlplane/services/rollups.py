"""Goodput minute rollups in the database: an SLO's stored history, and the upsert of
minutes the engine emitted (``goodput_rollup``, keyed by ``(slo_id, minute_start)``).

The live runtime (``controlplane.runtime.live``) is the one caller: it reads the history of SLOs
that enter the engine and upserts complete minutes on a timer. Like every service these
take the caller's session and never commit it.

Example::

    async with sessions() as session:
        rollups = await history(session, specs, now=time.time())
    async with sessions() as session, session.begin():
        await upsert(session, engine.rollups(time.time()))
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.goodput import MinuteRollup, SLOSpec
from controlplane.models import GoodputRollup, WalCheckpoint

__all__ = [
    "FLEET_CHECKPOINT",
    "HISTORY_MIN_S",
    "WAL_CHECKPOINT",
    "checkpoint",
    "history",
    "save_checkpoint",
    "upsert",
]

#: History loaded for an SLO: its compliance window, and at least a day (the ``1d`` window).
HISTORY_MIN_S = 86_400.0
#: Prefix of the keys of the violations document that hold unmeasured counts (``_row``).
UNMEASURED_PREFIX = "unmeasured:"
_COLUMNS = (
    "requests",
    "good",
    "errors",
    "aborted",
    "rejected",
    "output_tokens",
    "good_output_tokens",
    "violations",
    "sketch_blob",
    "rejected_by_class",
    "other_sketch_blob",
    "vantage",
)


async def history(
    session: AsyncSession, specs: Iterable[SLOSpec], *, now: float
) -> list[MinuteRollup]:
    """The stored minutes of each SLO over max(its window, a day) before ``now`` (Unix s),
    oldest first per SLO."""
    out: list[MinuteRollup] = []
    for spec in specs:
        since = datetime.fromtimestamp(now - max(spec.window_s, HISTORY_MIN_S), tz=UTC)
        rows = await session.scalars(
            sa.select(GoodputRollup)
            .where(
                GoodputRollup.slo_id == uuid.UUID(spec.id),
                GoodputRollup.minute_start >= since,
            )
            .order_by(GoodputRollup.minute_start)
        )
        out.extend(_to_rollup(row) for row in rows)
    return out


async def upsert(session: AsyncSession, rollups: Iterable[MinuteRollup]) -> int:
    """``INSERT … ON CONFLICT (slo_id, minute_start) DO UPDATE`` of every rollup (a minute
    the engine re-emits after late records replaces the stored one). Returns the rows sent."""
    rows = [_row(r) for r in rollups]
    if rows:
        await session.execute(_upsert(session.get_bind().dialect.name), rows)
    return len(rows)


def _to_rollup(row: GoodputRollup) -> MinuteRollup:
    violations: dict[str, int] = {}
    unmeasured: dict[str, int] = {}
    for key, value in row.violations.items():
        if key.startswith(UNMEASURED_PREFIX):
            unmeasured[key.removeprefix(UNMEASURED_PREFIX)] = value
        else:
            violations[key] = value
    return MinuteRollup(
        slo_id=str(row.slo_id),
        minute_start=row.minute_start,
        requests=row.requests,
        good=row.good,
        errors=row.errors,
        aborted=row.aborted,
        rejected=row.rejected,
        output_tokens=row.output_tokens,
        good_output_tokens=row.good_output_tokens,
        violations=violations,
        sketch_blob=bytes(row.sketch_blob),
        unmeasured=unmeasured,
        rejected_by_class=dict(row.rejected_by_class or {}),
        other_sketch_blob=bytes(row.other_sketch_blob or b""),
        vantage=row.vantage or "",
    )


def _row(rollup: MinuteRollup) -> dict[str, object]:
    row: dict[str, object] = {
        "slo_id": uuid.UUID(rollup.slo_id),
        "minute_start": rollup.minute_start,
        **{name: getattr(rollup, name) for name in _COLUMNS},
    }
    # Unmeasured counts ride in the violations document under prefixed keys (objective
    # keys never hold a colon): no column to migrate, and a stored minute without them
    # reads as fully measured, which is how it was judged.
    row["violations"] = {
        **rollup.violations,
        **{f"{UNMEASURED_PREFIX}{k}": n for k, n in rollup.unmeasured.items() if n},
    }
    # An SLO seen at one vantage, or that rejected nothing, stores nothing more.
    row["other_sketch_blob"] = rollup.other_sketch_blob or None
    row["vantage"] = rollup.vantage or None
    return row


def _upsert(dialect: str) -> sa.Executable:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(GoodputRollup)
    return statement.on_conflict_do_update(
        index_elements=[GoodputRollup.slo_id, GoodputRollup.minute_start],
        set_={name: statement.excluded[name] for name in _COLUMNS},
    )


#: The checkpoint row of the local write-ahead log, and of the fleet log (docs/scale-out.md).
WAL_CHECKPOINT, FLEET_CHECKPOINT = 1, 2


async def checkpoint(session: AsyncSession, row_id: int = WAL_CHECKPOINT) -> WalCheckpoint | None:
    """The write-ahead log's checkpoint row, or the fleet log's (``None`` on a fresh
    database)."""
    row: WalCheckpoint | None = await session.get(WalCheckpoint, row_id)
    return row


async def save_checkpoint(
    session: AsyncSession,
    *,
    epoch: str,
    segment: int,
    covered_until_minute: int,
    dedup: bytes,
    row_id: int = WAL_CHECKPOINT,
) -> None:
    """Upsert the checkpoint row (in the caller's transaction: the one of the rollups)."""
    values = {
        "id": row_id,
        "epoch": epoch,
        "segment": segment,
        "covered_until_minute": covered_until_minute,
        "dedup": dedup,
    }
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    statement = insert(WalCheckpoint).values(values)
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=[WalCheckpoint.id],
            set_={k: statement.excluded[k] for k in values if k != "id"},
        )
    )
