"""Automation routes under ``/api/v1/automation``: operators pause and resume the planner,
pin roles, move an instance by hand and run a tick now; viewers read the state, the pins
and the role moves (with their commands' ids, evidence, prediction and observed effect).
Every change is audited (``controlplane.services.automation``).

A tenant-scoped key reads the pins and moves of its tenant's members only (another's move is
a 404), and an operator's pins, unpins and moves only them (403 for a shared or another
tenant's member); the planner's switch and a tick now act on the whole fleet: cluster keys
only (``ClusterOperator``)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Body, Query, Response, status

from controlplane.api.deps import (
    ClusterOperator,
    Operator,
    PlannerDep,
    SessionDep,
    SettingsDep,
    Viewer,
)
from controlplane.api.routes._params import Limit, Offset
from controlplane.api.routes.fleet import MemberId
from controlplane.db import utcnow
from controlplane.errors import ConflictError, UnavailableError
from controlplane.models import FleetMember, MoveState, PoolRole, RoleMove
from controlplane.schemas.automation import (
    AutomationPublic,
    AutomationStatus,
    MoveCreate,
    MovePublic,
    MovesPublic,
    PauseBody,
    PinBody,
    PinPublic,
    TickPublic,
)
from controlplane.schemas.common import responses
from controlplane.schemas.fleet import MEMBER_ID_PATTERN
from controlplane.services import automation as service
from controlplane.services import fleet

__all__ = ["router"]

router = APIRouter(prefix="/automation", tags=["automation"])
MemberFilter = Annotated[
    str, Query(min_length=1, max_length=128, pattern=MEMBER_ID_PATTERN, description="member id")
]


@router.get("")
async def read_automation(
    principal: Viewer, session: SessionDep, runtime: PlannerDep, settings: SettingsDep
) -> AutomationStatus:
    """The planner's switch, whether its loop runs here, the pins, the moves in progress and
    what the last tick did. A tenant-scoped key sees the switch and the last tick's time,
    reason and plan evidence as they are (they are the whole fleet's), and of the pins, the
    moves in progress and the moves the tick started only its tenant's."""
    tenant = principal.tenant
    last_tick = None if runtime is None else runtime.last_tick
    if last_tick is not None and tenant is not None:
        ours = await service.tenant_moves(session, last_tick.moves_started, tenant=tenant)
        last_tick = last_tick.model_copy(update={"moves_started": ours})
    pins = await service.list_pins(session, tenant=tenant)
    return AutomationStatus(
        planner=service.automation_public(await service.get_state(session)),
        enabled=runtime is not None,
        interval_s=settings.planner_interval_s,
        pins=[PinPublic.model_validate(p) for p in pins],
        open_moves=await service.count_open_moves(session, tenant=tenant),
        last_tick=last_tick,
    )


@router.post("/pause")
async def pause(
    principal: ClusterOperator, session: SessionDep, body: Annotated[PauseBody, Body()]
) -> AutomationPublic:
    """Pause the planner: from its next tick it issues no command at all (moves in progress
    wait where they are) until resumed. Cluster keys only (a tenant's operator pins its
    members instead)."""
    row = await service.set_paused(
        session, paused=True, reason=body.reason, actor=principal.actor, now=utcnow()
    )
    return service.automation_public(row)


@router.post("/resume")
async def resume(
    principal: ClusterOperator, session: SessionDep, body: Annotated[PauseBody, Body()]
) -> AutomationPublic:
    row = await service.set_paused(
        session, paused=False, reason=body.reason, actor=principal.actor, now=utcnow()
    )
    return service.automation_public(row)


@router.get("/pins")
async def list_pins(principal: Viewer, session: SessionDep) -> list[PinPublic]:
    pins = await service.list_pins(session, tenant=principal.tenant)
    return [PinPublic.model_validate(p) for p in pins]


@router.put(
    "/pins/{member_id}",
    responses={201: {"model": PinPublic, "description": "Pinned"}, **responses(404)},
)
async def pin(
    principal: Operator,
    session: SessionDep,
    response: Response,
    member_id: MemberId,
    body: Annotated[PinBody, Body()],
) -> PinPublic:
    """Pin a member's role (200 when it was pinned already, 201 when new): the planner never
    moves it. A tenant-scoped key pins its tenant's members only."""
    await fleet.act_on(session, member_id, tenant=principal.tenant, key=principal.name)
    row, created = await service.pin(
        session, member_id, body.role, reason=body.reason, actor=principal.actor, now=utcnow()
    )
    if created:
        response.status_code = status.HTTP_201_CREATED
    return PinPublic.model_validate(row)


@router.delete("/pins/{member_id}", status_code=204, responses=responses(404))
async def unpin(principal: Operator, session: SessionDep, member_id: MemberId) -> Response:
    member = await session.get(FleetMember, member_id)
    if member is not None:  # without a member there is no pin either: the service's 404
        fleet.check_acts_on(member, tenant=principal.tenant, key=principal.name)
    await service.unpin(session, member_id, actor=principal.actor, now=utcnow())
    return Response(status_code=204)


async def _public(session: SessionDep, move: RoleMove) -> MovePublic:
    return service.move_public(move, await service.move_commands(session, move.id))


@router.get("/moves")
async def list_moves(
    *,
    principal: Viewer,
    session: SessionDep,
    state: MoveState | None = None,
    member_id: MemberFilter | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> MovesPublic:
    rows, count = await service.list_moves(
        session,
        state=state,
        member_id=member_id,
        limit=limit,
        offset=offset,
        tenant=principal.tenant,
    )
    return MovesPublic(data=[await _public(session, m) for m in rows], count=count)


@router.get("/moves/{move_id}", responses=responses(404))
async def read_move(principal: Viewer, session: SessionDep, move_id: uuid.UUID) -> MovePublic:
    move = await service.get_move(session, move_id, tenant=principal.tenant)
    return await _public(session, move)


@router.post(
    "/moves",
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": MovePublic, "description": "The move with this id, already started"},
        **responses(404, 409),
    },
)
async def create_move(
    principal: Operator,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    body: Annotated[MoveCreate, Body()],
) -> MovePublic:
    """Move a worker to another pool by hand: ``drain``, then ``set_role`` and ``resume``
    (the planner's tick carries it on; 201). The same ``id`` and body again answer the
    stored move (200); another body with that id, a pinned member or one already moving is
    a 409; an unknown member a 404. A tenant-scoped key moves its tenant's members only
    (403 for a shared or another tenant's member)."""
    if principal.tenant is not None:
        await fleet.act_on(session, body.member_id, tenant=principal.tenant, key=principal.name)
    if body.id is not None:
        existing = await session.get(RoleMove, body.id)
        if existing is not None:
            same = existing.member_id == body.member_id and existing.to_role == body.role
            if not same or existing.evidence.get("request") != body.model_dump(mode="json"):
                raise ConflictError(
                    f"role move {str(body.id)!r} exists with a different body; "
                    "use a new id for a new move"
                )
            response.status_code = status.HTTP_200_OK
            return await _public(session, existing)
    member = await fleet.get_member(session, body.member_id)
    if member.role.value == body.role.value:
        raise ConflictError(f"fleet member {member.id!r} already has role {body.role.value!r}")
    timings = service.MoveTimings(
        ttl_s=settings.planner_command_ttl_s,
        drain_timeout_s=settings.planner_drain_timeout_s,
        observe_after_s=settings.planner_observe_after_s,
    )
    live_switch = (member.load or {}).get("kv_both", True) is not False
    move = await service.start_move(
        session,
        member,
        PoolRole(body.role.value),
        mode="routing" if live_switch else "restart",
        evidence={
            "source": "manual",
            "actor": principal.actor,
            "reason": body.reason,
            "request": body.model_dump(mode="json"),
            "load": dict(member.load or {}),
        },
        predicted={},
        actor=principal.actor,
        now=utcnow(),
        timings=timings,
        move_id=body.id,
    )
    return await _public(session, move)


@router.post("/tick", responses=responses(503))
async def tick(_: ClusterOperator, runtime: PlannerDep) -> TickPublic:
    """Run one planner tick now (what the loop does every ``planner_interval_s``); 503 when
    the planner is disabled in this control plane."""
    if runtime is None:
        raise UnavailableError("the planner is disabled here (GOODPUT_PLANNER_ENABLED=false)")
    return await runtime.tick()
