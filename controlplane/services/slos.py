"""SLO use cases: create, read (by id or name), list, update, soft delete, apply, history,
and the bridge to the goodput engine (:func:`to_spec`).

Every create/update/delete bumps ``version``, writes an immutable ``slo_version`` snapshot
and an audit entry, all in the caller's transaction. An update that changes nothing writes
nothing (so re-applying the same file is a no-op).

Deleting is soft: the row keeps its id, history and rollups and disappears from reads unless
``include_deleted``. Its name is free again: creating an SLO with that name makes a *new* SLO
(new id, version 1, a fresh error budget), which is what re-creating a deleted thing means
to a user; the old one stays reachable by id for audit.

Tenant scope: a caller whose key is scoped to tenant ``T`` sees only SLOs whose selector has
``tenant: T`` and may only write such SLOs.

Goodput queries find their SLO through :func:`resolve_slo`, which reads the database's
answer from the :mod:`~controlplane.services.slos_cache` (``slo_cache_ttl_s``, 1 s): a
write here clears it (at once and again at its commit), one made by another process is seen
within the TTL.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from controlplane.errors import ConflictError, ForbiddenError, NotFoundError
from controlplane.goodput.spec import SLOSpec
from controlplane.models import SLO, SLOVantage, SLOVersion
from controlplane.schemas.slo import SLOCreate, SLOPublic, SLOUpdate
from controlplane.services import audit
from controlplane.services.slos_cache import CachedSLO, slo_cache
from exporters.records import Vantage
from exporters.slo import Metric, Objective

__all__ = [
    "ApplyAction",
    "SLOFilter",
    "apply_slo",
    "create_slo",
    "delete_slo",
    "get_slo",
    "list_slos",
    "list_versions",
    "live_specs",
    "resolve_slo",
    "slo_set_fingerprint",
    "slo_snapshot",
    "to_spec",
    "update_slo",
]

ApplyAction = Literal["created", "updated", "unchanged"]


def slo_snapshot(slo: SLO) -> dict[str, Any]:
    """The JSON-ready public form of an SLO (the version snapshot and audit before/after);
    ``warnings`` are derived from the definition, not part of it."""
    return SLOPublic.model_validate(slo).model_dump(mode="json", exclude={"warnings"})


def _engine_objectives(objectives: list[dict[str, Any]]) -> tuple[Objective, ...]:
    """One objective per (metric, statistic), in first-seen order: a request must meet every
    objective, so repeated ones reduce to the smallest threshold."""
    strictest: dict[tuple[str, str], float] = {}
    for o in objectives:
        key = (str(o["metric"]), str(o.get("statistic", "max")))
        threshold = float(o["threshold_s"])
        strictest[key] = min(threshold, strictest.get(key, threshold))
    return tuple(
        Objective(Metric(metric), t, statistic) for (metric, statistic), t in strictest.items()
    )


def to_spec(slo: SLO) -> SLOSpec:
    """The goodput engine's immutable view of a registry row."""
    return SLOSpec(
        id=str(slo.id),
        name=slo.name,
        objectives=_engine_objectives(slo.objectives),
        target=slo.target,
        window_s=float(slo.window_s),
        selector=dict(slo.selector),
        vantage=Vantage.GATEWAY if slo.vantage is SLOVantage.GATEWAY else Vantage.ENGINE,
        availability_target=slo.availability_target,
        version=slo.version,
        infeasible=slo.infeasible or "admit",  # a row not yet flushed has no default yet
    )


def _fields(data: SLOCreate | SLOUpdate, *, only_set: bool) -> dict[str, Any]:
    """Column values from a wire model (selector without unset labels, objectives as dicts)."""
    values = data.model_dump(exclude_unset=only_set, exclude={"selector", "objectives"})
    if "selector" in data.model_fields_set or not only_set:
        assert data.selector is not None
        values["selector"] = data.selector.model_dump(exclude_none=True)
    if "objectives" in data.model_fields_set or not only_set:
        assert data.objectives is not None
        values["objectives"] = [o.model_dump() for o in data.objectives]
    return values


def _check_tenant(selector: dict[str, str], tenant: str | None) -> None:
    if tenant is not None and selector.get("tenant") != tenant:
        raise ForbiddenError(
            f"this key is scoped to tenant {tenant!r}: selector.tenant must be {tenant!r}, "
            f"got {selector.get('tenant')!r}"
        )


def _label_equals(key: str, value: str) -> sa.ColumnElement[bool]:
    condition: sa.ColumnElement[bool] = SLO.selector[key].as_string() == value
    return condition


_CLEARS_CACHE = "goodput.clears_slo_cache"


def _clear_cache(session: AsyncSession) -> None:
    """An SLO is being written in ``session``: clear the SLO cache of its database now and
    once more when the session commits (reads begun before the commit are then refused)."""
    cache = slo_cache(session.get_bind())
    cache.clear()
    sync = session.sync_session
    if not sync.info.get(_CLEARS_CACHE):
        sync.info[_CLEARS_CACHE] = True
        sa.event.listen(sync, "after_commit", lambda _session: cache.clear())


async def _write_version(session: AsyncSession, slo: SLO, *, actor: str, now: datetime) -> None:
    session.add(
        SLOVersion(
            slo_id=slo.id,
            version=slo.version,
            snapshot=slo_snapshot(slo),
            actor=actor,
            created_at=now,
        )
    )
    await session.flush()


async def _live_by_name(session: AsyncSession, name: str) -> SLO | None:
    live: SLO | None = await session.scalar(
        sa.select(SLO).where(SLO.name == name, SLO.deleted_at.is_(None))
    )
    return live


async def _ensure_name_free(
    session: AsyncSession, name: str, *, other_than: uuid.UUID | None
) -> None:
    live = await _live_by_name(session, name)
    if live is not None and live.id != other_than:
        raise ConflictError(f"an SLO named {name!r} already exists (id {live.id})")


async def create_slo(
    session: AsyncSession, data: SLOCreate, *, actor: str, now: datetime, tenant: str | None = None
) -> SLO:
    values = _fields(data, only_set=False)
    _check_tenant(values["selector"], tenant)
    await _ensure_name_free(session, data.name, other_than=None)
    slo = SLO(**values, version=1, created_at=now, updated_at=now)
    _clear_cache(session)
    session.add(slo)
    await session.flush()
    await _write_version(session, slo, actor=actor, now=now)
    await audit.record(
        session,
        actor=actor,
        action="slo.create",
        target_type="slo",
        target_id=str(slo.id),
        before=None,
        after=slo_snapshot(slo),
        now=now,
    )
    return slo


def _as_uuid(ref: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(ref)
    except ValueError:
        return None


async def get_slo(
    session: AsyncSession, ref: str, *, include_deleted: bool = False, tenant: str | None = None
) -> SLO:
    """The SLO with id ``ref``, or else the live SLO named ``ref`` (with ``include_deleted``,
    the most recently deleted one when none is live). Out-of-scope SLOs are not found."""
    slo_id = _as_uuid(ref)
    slo: SLO | None
    if slo_id is not None:
        slo = await session.get(SLO, slo_id)
        if slo is not None and slo.deleted_at is not None and not include_deleted:
            slo = None
    else:
        query = sa.select(SLO).where(SLO.name == ref)
        if not include_deleted:
            query = query.where(SLO.deleted_at.is_(None))
        # Live first (NULL deleted_at), then the latest deletion.
        query = query.order_by(SLO.deleted_at.is_not(None), SLO.deleted_at.desc()).limit(1)
        slo = await session.scalar(query)
    if slo is None or (tenant is not None and slo.selector.get("tenant") != tenant):
        kind = "id" if slo_id is not None else "name"
        raise NotFoundError(f"SLO with {kind} {ref!r} not found")
    return slo


async def resolve_slo(
    engine: AsyncEngine,
    ref: str,
    *,
    tenant: str | None = None,
    ttl_s: float | None = None,
    fresh: bool = False,
) -> CachedSLO:
    """The live SLO with id ``ref`` or named ``ref``, as :func:`get_slo` finds it, through
    the database's SLO cache (at most ``ttl_s`` old, by default the cache's; with ``fresh``,
    read now). A session
    is opened only when the cache does not hold ``ref``. Out-of-scope SLOs are not found."""

    async def fetch(key: str) -> CachedSLO | None:
        # One statement, outside a transaction: no BEGIN and ROLLBACK round trips.
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            async with AsyncSession(bind=conn) as session:
                try:
                    return CachedSLO.of(await get_slo(session, key))
                except NotFoundError:
                    return None

    cache = slo_cache(engine, ttl_s=ttl_s)
    slo = await (cache.read(ref, fetch) if fresh else cache.resolve(ref, fetch))
    if slo is None or (tenant is not None and slo.tenant != tenant):
        kind = "id" if _as_uuid(ref) is not None else "name"
        raise NotFoundError(f"SLO with {kind} {ref!r} not found")
    return slo


@dataclass(frozen=True, slots=True)
class SLOFilter:
    """List filters: ``name_prefix``; ``model``/``tenant`` match the selector's label exactly."""

    name_prefix: str | None = None
    model: str | None = None
    tenant: str | None = None
    include_deleted: bool = False


async def list_slos(
    session: AsyncSession,
    where: SLOFilter,
    *,
    limit: int,
    offset: int,
    scope_tenant: str | None = None,
) -> tuple[list[SLO], int]:
    """One page of SLOs ordered by name (then creation), and the number matching."""
    conditions: list[sa.ColumnElement[bool]] = []
    if not where.include_deleted:
        conditions.append(SLO.deleted_at.is_(None))
    if where.name_prefix:
        conditions.append(SLO.name.startswith(where.name_prefix, autoescape=True))
    if where.model is not None:
        conditions.append(_label_equals("model", where.model))
    if where.tenant is not None:
        conditions.append(_label_equals("tenant", where.tenant))
    if scope_tenant is not None:
        conditions.append(_label_equals("tenant", scope_tenant))
    count = await session.scalar(sa.select(sa.func.count()).select_from(SLO).where(*conditions))
    rows = await session.scalars(
        sa.select(SLO)
        .where(*conditions)
        .order_by(SLO.name, SLO.created_at, SLO.id)
        .limit(limit)
        .offset(offset)
    )
    return list(rows), int(count or 0)


async def _update(
    session: AsyncSession,
    slo: SLO,
    values: dict[str, Any],
    *,
    actor: str,
    now: datetime,
    tenant: str | None,
) -> bool:
    """Apply ``values``; False (and no writes) when they change nothing."""
    changed = {k: v for k, v in values.items() if getattr(slo, k) != v}
    if not changed:
        return False
    _check_tenant(changed.get("selector", slo.selector), tenant)
    if "name" in changed:
        await _ensure_name_free(session, changed["name"], other_than=slo.id)
    before = slo_snapshot(slo)
    _clear_cache(session)
    for key, value in changed.items():
        setattr(slo, key, value)
    slo.version += 1
    slo.updated_at = now
    await session.flush()
    await _write_version(session, slo, actor=actor, now=now)
    await audit.record(
        session,
        actor=actor,
        action="slo.update",
        target_type="slo",
        target_id=str(slo.id),
        before=before,
        after=slo_snapshot(slo),
        now=now,
    )
    return True


async def update_slo(
    session: AsyncSession,
    ref: str,
    changes: SLOUpdate,
    *,
    actor: str,
    now: datetime,
    tenant: str | None = None,
) -> SLO:
    """Patch the fields set in ``changes``; bumps the version only if something changed."""
    slo = await get_slo(session, ref, tenant=tenant)
    await _update(
        session, slo, _fields(changes, only_set=True), actor=actor, now=now, tenant=tenant
    )
    return slo


async def apply_slo(
    session: AsyncSession, data: SLOCreate, *, actor: str, now: datetime, tenant: str | None = None
) -> tuple[ApplyAction, SLO]:
    """Create the SLO, or make the live SLO of that name equal to ``data`` (declarative)."""
    live = await _live_by_name(session, data.name)
    if live is None or (tenant is not None and live.selector.get("tenant") != tenant):
        if live is not None:
            raise ConflictError(f"an SLO named {data.name!r} exists outside this key's tenant")
        return "created", await create_slo(session, data, actor=actor, now=now, tenant=tenant)
    changed = await _update(
        session, live, _fields(data, only_set=False), actor=actor, now=now, tenant=tenant
    )
    return ("updated" if changed else "unchanged"), live


async def delete_slo(
    session: AsyncSession, ref: str, *, actor: str, now: datetime, tenant: str | None = None
) -> SLO:
    """Soft-delete a live SLO (a deleted one is not found)."""
    slo = await get_slo(session, ref, tenant=tenant)
    before = slo_snapshot(slo)
    _clear_cache(session)
    slo.deleted_at = now
    slo.updated_at = now
    slo.version += 1
    await session.flush()
    await _write_version(session, slo, actor=actor, now=now)
    await audit.record(
        session,
        actor=actor,
        action="slo.delete",
        target_type="slo",
        target_id=str(slo.id),
        before=before,
        after=slo_snapshot(slo),
        now=now,
    )
    return slo


async def list_versions(
    session: AsyncSession, ref: str, *, limit: int, offset: int, tenant: str | None = None
) -> tuple[list[SLOVersion], int]:
    """An SLO's history, newest first (deleted SLOs included: history outlives the SLO)."""
    slo = await get_slo(session, ref, include_deleted=True, tenant=tenant)
    count = await session.scalar(
        sa.select(sa.func.count()).select_from(SLOVersion).where(SLOVersion.slo_id == slo.id)
    )
    rows = await session.scalars(
        sa.select(SLOVersion)
        .where(SLOVersion.slo_id == slo.id)
        .order_by(SLOVersion.version.desc())
        .limit(limit)
        .offset(offset)
    )
    return list(rows), int(count or 0)


async def live_specs(session: AsyncSession) -> list[SLOSpec]:
    """Every live SLO as an engine spec (what the goodput engine loads at start and reload)."""
    rows = await session.scalars(sa.select(SLO).where(SLO.deleted_at.is_(None)).order_by(SLO.name))
    return [to_spec(slo) for slo in rows]


async def slo_set_fingerprint(session: AsyncSession) -> tuple[int, int, str]:
    """One cheap aggregate of the ``slo`` table that changes whenever an SLO is created
    (row count), updated or deleted (sum of versions, latest ``updated_at``): the live
    engine polls it and reloads :func:`live_specs` only when it changes."""
    row = (
        await session.execute(
            sa.select(
                sa.func.count(),
                sa.func.coalesce(sa.func.sum(SLO.version), 0),
                sa.func.max(SLO.updated_at),
            )
        )
    ).one()
    return int(row[0]), int(row[1]), str(row[2])
