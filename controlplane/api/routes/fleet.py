"""Fleet routes (``/api/v1/fleet``): agents register and beat (role ``agent``, each key for
the members it registered: ``controlplane.services.agents``); viewers list and read (a
tenant-scoped key its tenant's members only: others are absent from the list and 404)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from controlplane.api.deps import Agent, SessionDep, SettingsDep, Viewer
from controlplane.api.routes._params import FilterText, Limit, Offset
from controlplane.db import utcnow
from controlplane.models import FleetKind, FleetState, PoolRole
from controlplane.schemas.common import responses
from controlplane.schemas.fleet import (
    MEMBER_ID_PATTERN,
    FleetHeartbeat,
    FleetMemberPublic,
    FleetMembersPublic,
    FleetRegister,
)
from controlplane.services import agents
from controlplane.services import fleet as service

__all__ = ["router"]

router = APIRouter(prefix="/fleet", tags=["fleet"])

MemberId = Annotated[str, Path(min_length=1, max_length=128, pattern=MEMBER_ID_PATTERN)]


@router.post("/register")
async def register(
    principal: Agent, session: SessionDep, settings: SettingsDep, body: FleetRegister
) -> FleetMemberPublic:
    """Announce a gateway or worker (again after a restart: the entry is refreshed)."""
    now = utcnow()
    member, _ = await service.register(session, body, actor=principal.actor, now=now)
    # After the write, in its transaction: a refusal rolls the overwrite back.
    await agents.act_for(session, body.id, key_id=principal.key_id, role=principal.role, now=now)
    return service.member_public(member, now=now, timeout_s=settings.fleet_heartbeat_timeout_s)


@router.post("/{member_id}/heartbeat", responses=responses(404))
async def heartbeat(
    principal: Agent,
    session: SessionDep,
    settings: SettingsDep,
    member_id: MemberId,
    body: FleetHeartbeat,
) -> FleetMemberPublic:
    """Liveness and load; 404 means the control plane forgot the member: register again."""
    now = utcnow()
    member = await service.heartbeat(session, member_id, body, actor=principal.actor, now=now)
    await agents.act_for(session, member_id, key_id=principal.key_id, role=principal.role, now=now)
    return service.member_public(member, now=now, timeout_s=settings.fleet_heartbeat_timeout_s)


@router.get("")
async def list_fleet(
    *,
    principal: Viewer,
    session: SessionDep,
    settings: SettingsDep,
    kind: FleetKind | None = None,
    model: FilterText | None = None,
    role: PoolRole | None = None,
    state: FleetState | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> FleetMembersPublic:
    where = service.FleetFilter(kind=kind, model=model, role=role, state=state)
    rows, count = await service.list_members(
        session, where, limit=limit, offset=offset, tenant=principal.tenant
    )
    now = utcnow()
    timeout_s = settings.fleet_heartbeat_timeout_s
    return FleetMembersPublic(
        data=[service.member_public(m, now=now, timeout_s=timeout_s) for m in rows], count=count
    )


@router.get("/{member_id}", responses=responses(404))
async def read_member(
    principal: Viewer, session: SessionDep, settings: SettingsDep, member_id: MemberId
) -> FleetMemberPublic:
    member = await service.get_member(session, member_id, tenant=principal.tenant)
    return service.member_public(member, now=utcnow(), timeout_s=settings.fleet_heartbeat_timeout_s)
