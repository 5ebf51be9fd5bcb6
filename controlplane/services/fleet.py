"""Fleet registry: agents register their gateway or worker and send heartbeats.

Registration and state changes are audited; a heartbeat that only refreshes the load is
not (agents beat every few seconds: auditing that would drown the log). ``stale`` members
(no heartbeat within the timeout) are reported as such, not deleted: a member that comes
back simply beats again.

**Tenancy.** A member registered with a ``tenant`` serves that tenant's pool; one without
is the cluster's (shared). Functions that take ``tenant`` (the caller's key scope;
``None``: a cluster key, every member) keep a tenant-scoped key to its tenant's members:
reads treat another's member as absent (404), :func:`act_on` refuses to act on it (403,
naming why: shared, or another tenant's).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.errors import ForbiddenError, NotFoundError
from controlplane.models import FleetKind, FleetMember, FleetState, PoolRole
from controlplane.schemas.fleet import FleetHeartbeat, FleetMemberPublic, FleetRegister
from controlplane.services import audit

__all__ = [
    "FleetFilter",
    "act_on",
    "check_acts_on",
    "get_member",
    "heartbeat",
    "is_stale",
    "list_members",
    "member_public",
    "register",
    "tenant_members",
    "visible",
]


def is_stale(member: FleetMember, *, now: datetime, timeout_s: float) -> bool:
    last = member.last_heartbeat_at
    return last is None or now - last > timedelta(seconds=timeout_s)


def member_public(member: FleetMember, *, now: datetime, timeout_s: float) -> FleetMemberPublic:
    public = FleetMemberPublic.model_validate(member)
    public.stale = is_stale(member, now=now, timeout_s=timeout_s)
    return public


def _snapshot(member: FleetMember) -> dict[str, Any]:
    return FleetMemberPublic.model_validate(member).model_dump(mode="json", exclude={"stale"})


async def register(
    session: AsyncSession, data: FleetRegister, *, actor: str, now: datetime
) -> tuple[FleetMember, bool]:
    """Create or refresh the member ``data.id``; returns it and whether it was new.

    Registering counts as a heartbeat. Re-registration (an agent restarting) replaces the
    endpoint, model, role, state and load, and keeps ``registered_at``.
    """
    member = await session.get(FleetMember, data.id)
    created = member is None
    before = None if member is None else _snapshot(member)
    if member is None:
        member = FleetMember(id=data.id, registered_at=now)
        session.add(member)
    member.kind = data.kind
    member.endpoint = data.endpoint
    member.model = data.model
    member.role = data.role
    member.state = data.state
    member.load = dict(data.load)
    member.tenant = data.tenant
    member.last_heartbeat_at = now
    await session.flush()
    await audit.record(
        session,
        actor=actor,
        action="fleet.register",
        target_type="fleet_member",
        target_id=member.id,
        before=before,
        after=_snapshot(member),
        now=now,
    )
    return member, created


def visible(member: FleetMember, tenant: str | None) -> bool:
    """Whether a key scoped to ``tenant`` (``None``: every tenant) reaches ``member``."""
    return tenant is None or member.tenant == tenant


def tenant_members(tenant: str) -> sa.Select[str]:
    """The ids of ``tenant``'s members, for ``IN`` conditions on what refers to them."""
    return sa.select(FleetMember.id).where(FleetMember.tenant == tenant)


async def get_member(
    session: AsyncSession, member_id: str, *, tenant: str | None = None
) -> FleetMember:
    """The member ``member_id``; a :class:`NotFoundError` when there is none, or when it is
    not ``tenant``'s (a scoped key does not learn that another tenant's member exists)."""
    member = await session.get(FleetMember, member_id)
    if member is None or not visible(member, tenant):
        raise NotFoundError(f"fleet member {member_id!r} not found; register it first")
    return member


def check_acts_on(member: FleetMember, *, tenant: str | None, key: str) -> None:
    """Raise :class:`ForbiddenError` unless a key scoped to ``tenant`` (named ``key``) may
    act on ``member``: a cluster key acts on every member, a tenant key on its tenant's."""
    if visible(member, tenant):
        return
    whose = (
        "the cluster's (shared, registered without a tenant)"
        if member.tenant is None
        else "another tenant's"
    )
    raise ForbiddenError(
        f"fleet member {member.id!r} is {whose}; key {key!r} is scoped to tenant "
        f"{tenant!r} and acts only on that tenant's members"
    )


async def act_on(
    session: AsyncSession, member_id: str, *, tenant: str | None, key: str
) -> FleetMember:
    """The member a key scoped to ``tenant`` acts on (a command, a pin, a move): 404 when
    there is none, 403 when it is not the tenant's (:func:`check_acts_on`)."""
    member = await get_member(session, member_id)
    check_acts_on(member, tenant=tenant, key=key)
    return member


async def heartbeat(
    session: AsyncSession, member_id: str, data: FleetHeartbeat, *, actor: str, now: datetime
) -> FleetMember:
    member = await get_member(session, member_id)
    before = _snapshot(member)
    member.last_heartbeat_at = now
    member.load = dict(data.load)
    state_changed = data.state is not None and data.state != member.state
    if data.state is not None:
        member.state = data.state
    await session.flush()
    if state_changed:
        await audit.record(
            session,
            actor=actor,
            action="fleet.state",
            target_type="fleet_member",
            target_id=member.id,
            before=before,
            after=_snapshot(member),
            now=now,
        )
    return member


@dataclass(frozen=True, slots=True)
class FleetFilter:
    kind: FleetKind | None = None
    model: str | None = None
    role: PoolRole | None = None
    state: FleetState | None = None


async def list_members(
    session: AsyncSession,
    where: FleetFilter,
    *,
    limit: int,
    offset: int,
    tenant: str | None = None,
) -> tuple[list[FleetMember], int]:
    """One page of members ordered by id, and the number matching; with ``tenant``, of
    that tenant's members only."""
    conditions: list[sa.ColumnElement[bool]] = []
    if tenant is not None:
        conditions.append(FleetMember.tenant == tenant)
    if where.kind is not None:
        conditions.append(FleetMember.kind == where.kind)
    if where.model is not None:
        conditions.append(FleetMember.model == where.model)
    if where.role is not None:
        conditions.append(FleetMember.role == where.role)
    if where.state is not None:
        conditions.append(FleetMember.state == where.state)
    count = await session.scalar(
        sa.select(sa.func.count()).select_from(FleetMember).where(*conditions)
    )
    rows = await session.scalars(
        sa.select(FleetMember)
        .where(*conditions)
        .order_by(FleetMember.id)
        .limit(limit)
        .offset(offset)
    )
    return list(rows), int(count or 0)
