"""Command routes: agents poll and acknowledge their commands under ``/api/v1/fleet``
(role ``agent``, the client side is ``serving.workers.agent``); operators issue commands and
viewers read them under ``/api/v1/commands`` (a tenant-scoped key to and of its tenant's
members only)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Body, Query, Response, status

from controlplane.api.deps import Agent, Operator, SessionDep, Viewer
from controlplane.api.routes._params import Limit, Offset
from controlplane.api.routes.fleet import MemberId
from controlplane.db import utcnow
from controlplane.models import CommandState
from controlplane.schemas.commands import (
    AckWire,
    CommandIssue,
    CommandPublic,
    CommandsPublic,
    CommandsWire,
    CommandWire,
)
from controlplane.schemas.common import responses
from controlplane.schemas.fleet import MEMBER_ID_PATTERN
from controlplane.services import agents, fleet
from controlplane.services import commands as service
from exporters.commands import CommandKind

__all__ = ["router"]

fleet_router = APIRouter(prefix="/fleet", tags=["commands"])
commands_router = APIRouter(prefix="/commands", tags=["commands"])
TargetFilter = Annotated[
    str, Query(min_length=1, max_length=128, pattern=MEMBER_ID_PATTERN, description="member id")
]


@fleet_router.get("/{member_id}/commands")
async def poll_commands(principal: Agent, session: SessionDep, member_id: MemberId) -> CommandsWire:
    """The member's due commands, in ``exporters.commands`` JSON, marked delivered.

    An unknown member gets an empty list, not a 404: the agent reads a 404 here as "this
    control plane has no command route" and would stop asking for a while.
    """
    now = utcnow()
    rows = await service.deliver(session, member_id, now=now)
    # After the delivery, in its transaction: a refusal rolls the delivery back.
    await agents.act_for(session, member_id, key_id=principal.key_id, role=principal.role, now=now)
    data = [CommandWire.model_validate(service.to_wire(command)) for command in rows]
    return CommandsWire(data=data, count=len(data))


@fleet_router.post("/{member_id}/commands/{command_id}/ack", responses=responses(404))
async def ack_command(
    principal: Agent,
    session: SessionDep,
    member_id: MemberId,
    command_id: uuid.UUID,
    body: AckWire,
) -> CommandPublic:
    """The member's ``CommandAck``; repeating it (or acking a re-delivery) changes nothing."""
    now = utcnow()
    command = await service.acknowledge(
        session, member_id, command_id, body, actor=principal.actor, now=now
    )
    await agents.act_for(session, member_id, key_id=principal.key_id, role=principal.role, now=now)
    return service.command_public(command)


@commands_router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": CommandPublic, "description": "The command with this id, already issued"},
        **responses(404, 409),
    },
)
async def issue_command(
    principal: Operator,
    session: SessionDep,
    response: Response,
    body: Annotated[CommandIssue, Body()],
) -> CommandPublic:
    """Issue a command to a fleet member (201); the same ``id`` and body again answers the
    stored command (200), the same ``id`` with another body is a 409. A tenant-scoped key
    commands its tenant's members only (403 for a shared or another tenant's member)."""
    if principal.tenant is not None:
        await fleet.act_on(session, body.target, tenant=principal.tenant, key=principal.name)
    command, created = await service.issue(session, body, actor=principal.actor, now=utcnow())
    if not created:
        response.status_code = status.HTTP_200_OK
    return service.command_public(command)


@commands_router.get("")
async def list_commands(
    *,
    principal: Viewer,
    session: SessionDep,
    target: TargetFilter | None = None,
    state: CommandState | None = None,
    kind: CommandKind | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> CommandsPublic:
    where = service.CommandFilter(
        target=target, state=state, kind=None if kind is None else kind.value
    )
    rows, count = await service.list_commands(
        session, where, limit=limit, offset=offset, tenant=principal.tenant
    )
    return CommandsPublic(data=[service.command_public(c) for c in rows], count=count)


@commands_router.get("/{command_id}", responses=responses(404))
async def read_command(
    principal: Viewer, session: SessionDep, command_id: uuid.UUID
) -> CommandPublic:
    command = await service.get_command(session, command_id, tenant=principal.tenant)
    return service.command_public(command)


# One router for create_app: both halves share the service and the tag.
router = APIRouter()
router.include_router(fleet_router)
router.include_router(commands_router)
