"""Automation: the planner's pause switch, role pins, and role moves (use cases that take a
session; the planner tick in ``controlplane.runtime.planner`` and the ``/automation``
routes call them).

A **role move** changes one worker's pool by commands, in order: ``drain`` (no new work;
in-flight work completes) → once the worker reports ``drained``, is idle, or
``drain_timeout_s`` passed since the drain was acknowledged: ``set_role`` then ``resume``
→ ``done`` when both are acknowledged. A refused or expired command fails the move (a
failed ``set_role`` still gets its ``resume``, so no worker stays drained). Each command
carries the move's evidence and predicted effect; ``observe_after_s`` after a move is done,
the observed effect is recorded on the move and beside each command's prediction.

Pausing, resuming, pinning, unpinning and starting a move are audited
(``automation.pause``, ``automation.resume``, ``role.pin``, ``role.unpin``,
``move.start``), as is every command issued (``command.issue``).

Reads that take ``tenant`` (a key's tenant scope; ``None``: every member) keep to the pins
and moves of that tenant's members (``controlplane.services.fleet``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.errors import ConflictError, NotFoundError
from controlplane.models import (
    Automation,
    Command,
    CommandState,
    FleetMember,
    FleetState,
    MoveState,
    PoolRole,
    RoleMove,
    RolePin,
)
from controlplane.schemas.automation import AutomationPublic, MovePublic, PinPublic
from controlplane.services import audit
from controlplane.services.commands import issue_for_move
from controlplane.services.fleet import get_member, tenant_members
from exporters.commands import CommandKind

__all__ = [
    "OPEN_MOVES",
    "PLANNER",
    "MoveTimings",
    "advance_move",
    "count_open_moves",
    "get_move",
    "get_state",
    "list_moves",
    "list_pins",
    "move_commands",
    "pin",
    "record_observed",
    "set_paused",
    "start_move",
    "tenant_moves",
    "unpin",
]

PLANNER = "planner"
OPEN_MOVES = (MoveState.DRAINING, MoveState.SWITCHING)
_BAD = (CommandState.FAILED, CommandState.EXPIRED)


@dataclass(frozen=True, slots=True)
class MoveTimings:
    """``ttl_s``: each command's validity; ``drain_timeout_s``: how long a drained worker
    may take to finish its in-flight work before it switches anyway (its streams carry on
    where they are: the switch only changes new routing); ``observe_after_s``: when the
    effect is recorded."""

    ttl_s: float = 120.0
    drain_timeout_s: float = 120.0
    observe_after_s: float = 60.0


def automation_public(row: Automation | None) -> AutomationPublic:
    if row is None:
        return AutomationPublic(
            name=PLANNER, paused=False, reason="", updated_by="", updated_at=None
        )
    return AutomationPublic.model_validate(row)


async def get_state(session: AsyncSession, name: str = PLANNER) -> Automation | None:
    return await session.get(Automation, name)


async def set_paused(
    session: AsyncSession, *, paused: bool, reason: str, actor: str, now: datetime
) -> Automation:
    """Pause or resume the planner (a paused planner issues no command at all)."""
    row = await get_state(session)
    before = automation_public(row).model_dump(mode="json")
    if row is None:
        row = Automation(name=PLANNER)
        session.add(row)
    row.paused, row.reason, row.updated_by, row.updated_at = paused, reason, actor, now
    await session.flush()
    await audit.record(
        session,
        actor=actor,
        action="automation.pause" if paused else "automation.resume",
        target_type="automation",
        target_id=PLANNER,
        before=before,
        after=automation_public(row).model_dump(mode="json"),
        now=now,
    )
    return row


async def list_pins(session: AsyncSession, *, tenant: str | None = None) -> list[RolePin]:
    query = sa.select(RolePin).order_by(RolePin.member_id)
    if tenant is not None:
        query = query.where(RolePin.member_id.in_(tenant_members(tenant)))
    return list(await session.scalars(query))


def _pin_json(pin_row: RolePin) -> dict[str, Any]:
    return PinPublic.model_validate(pin_row).model_dump(mode="json")


async def pin(
    session: AsyncSession,
    member_id: str,
    role: PoolRole,
    *,
    reason: str,
    actor: str,
    now: datetime,
) -> tuple[RolePin, bool]:
    """Pin ``member_id`` to ``role`` (the planner never moves it); returns the pin and
    whether it is new. Pinning changes no routing by itself: a pin to a role the worker
    does not have yet is for an operator's move (``POST /automation/moves``)."""
    await get_member(session, member_id)
    row = await session.get(RolePin, member_id)
    before = None if row is None else _pin_json(row)
    created = row is None
    if row is None:
        row = RolePin(member_id=member_id, created_at=now)
        session.add(row)
    row.role, row.reason, row.actor = role, reason, actor
    await session.flush()
    await audit.record(
        session,
        actor=actor,
        action="role.pin",
        target_type="fleet_member",
        target_id=member_id,
        before=before,
        after=_pin_json(row),
        now=now,
    )
    return row, created


async def unpin(session: AsyncSession, member_id: str, *, actor: str, now: datetime) -> None:
    row = await session.get(RolePin, member_id)
    if row is None:
        raise NotFoundError(f"fleet member {member_id!r} has no role pin")
    before = _pin_json(row)
    await session.delete(row)
    await session.flush()
    await audit.record(
        session,
        actor=actor,
        action="role.unpin",
        target_type="fleet_member",
        target_id=member_id,
        before=before,
        after=None,
        now=now,
    )


async def move_commands(session: AsyncSession, move_id: uuid.UUID) -> list[Command]:
    rows = await session.scalars(
        sa.select(Command).where(Command.move_id == move_id).order_by(Command.created_at)
    )
    return list(rows)


def move_public(move: RoleMove, commands: list[Command]) -> MovePublic:
    public = MovePublic.model_validate(move)
    public.command_ids = [c.id for c in commands]
    return public


async def start_move(
    session: AsyncSession,
    member: FleetMember,
    to_role: PoolRole,
    *,
    mode: str,
    evidence: dict[str, Any],
    predicted: dict[str, Any],
    actor: str,
    now: datetime,
    timings: MoveTimings,
    move_id: uuid.UUID | None = None,
) -> RoleMove:
    """Begin moving ``member`` to ``to_role``: store the move and send ``drain``. A pinned
    member or one already moving is a :class:`ConflictError`."""
    pinned = await session.get(RolePin, member.id)
    if pinned is not None:
        raise ConflictError(
            f"fleet member {member.id!r} is pinned to {pinned.role.value!r}; unpin it first"
        )
    busy = await session.scalar(
        sa.select(RoleMove.id).where(
            RoleMove.member_id == member.id, RoleMove.state.in_(OPEN_MOVES)
        )
    )
    if busy is not None:
        raise ConflictError(f"fleet member {member.id!r} is already moving (move {busy})")
    move = RoleMove(
        id=move_id or uuid.uuid4(),
        member_id=member.id,
        from_role=member.role,
        to_role=to_role,
        mode=mode,
        source=actor,
        state=MoveState.DRAINING,
        evidence=evidence,
        predicted_effect=predicted,
        detail="drain sent",
        created_at=now,
        updated_at=now,
    )
    session.add(move)
    await session.flush()
    command = await issue_for_move(
        session,
        target=member.id,
        kind=CommandKind.DRAIN,
        payload={},
        move_id=move.id,
        evidence=evidence,
        predicted_effect=predicted,
        actor=actor,
        now=now,
        ttl_s=timings.ttl_s,
    )
    await audit.record(
        session,
        actor=actor,
        action="move.start",
        target_type="role_move",
        target_id=str(move.id),
        before=None,
        after=move_public(move, [command]).model_dump(mode="json"),
        now=now,
    )
    return move


def _idle(member: FleetMember) -> bool:
    load = member.load or {}
    return bool(
        load.get("num_requests_running", 1) == 0 and load.get("num_requests_waiting", 1) == 0
    )


async def advance_move(
    session: AsyncSession,
    move: RoleMove,
    member: FleetMember | None,
    *,
    actor: str,
    now: datetime,
    timings: MoveTimings,
) -> bool:
    """One step of ``move``'s state machine (see the module docstring); ``True`` when it
    changed."""
    commands = await move_commands(session, move.id)
    by_kind = {c.kind: c for c in commands}
    drain = by_kind.get(CommandKind.DRAIN.value)
    if member is None or drain is None:
        return _finish(move, MoveState.FAILED, "the fleet member or its drain is gone", now)
    if move.state is MoveState.DRAINING:
        if drain.state in _BAD:
            return _finish(move, MoveState.FAILED, f"drain {drain.state.value}", now)
        if drain.state is not CommandState.ACKED or drain.acked_at is None:
            return False
        timed_out = now - drain.acked_at >= timedelta(seconds=timings.drain_timeout_s)
        if not (member.state is FleetState.DRAINED or _idle(member) or timed_out):
            return False
        # resume a microsecond after set_role: delivery is oldest first, so the worker
        # takes its new role before it takes new work.
        for offset_us, kind, payload in (
            (0, CommandKind.SET_ROLE, {"role": move.to_role.value}),
            (1, CommandKind.RESUME, {}),
        ):
            await issue_for_move(
                session,
                target=member.id,
                kind=kind,
                payload=payload,
                move_id=move.id,
                evidence=move.evidence,
                predicted_effect=move.predicted_effect,
                actor=actor,
                now=now + timedelta(microseconds=offset_us),
                ttl_s=timings.ttl_s,
            )
        why = "drain timed out" if timed_out and not _idle(member) else "drained"
        move.state, move.detail, move.updated_at = MoveState.SWITCHING, f"{why}; switching", now
        return True
    if move.state is MoveState.SWITCHING:
        rest = [by_kind.get(k.value) for k in (CommandKind.SET_ROLE, CommandKind.RESUME)]
        if any(c is None or c.state in _BAD for c in rest):
            states = ", ".join(f"{c.kind} {c.state.value}" for c in rest if c is not None)
            return _finish(move, MoveState.FAILED, f"switch failed ({states})", now)
        if all(c is not None and c.state is CommandState.ACKED for c in rest):
            done = _finish(move, MoveState.DONE, "role changed and resumed", now)
            move.observe_at = now + timedelta(seconds=timings.observe_after_s)
            return done
    return False


def _finish(move: RoleMove, state: MoveState, detail: str, now: datetime) -> bool:
    move.state, move.detail, move.updated_at = state, detail, now
    return True


async def record_observed(session: AsyncSession, move: RoleMove, observed: dict[str, Any]) -> None:
    """Store the observed effect on the move and beside each of its commands' prediction."""
    move.observed_effect = observed
    for command in await move_commands(session, move.id):
        command.observed_effect = {**(command.observed_effect or {}), "observed": observed}
    await session.flush()


def _of_tenant(tenant: str | None) -> list[sa.ColumnElement[bool]]:
    return [] if tenant is None else [RoleMove.member_id.in_(tenant_members(tenant))]


async def count_open_moves(session: AsyncSession, *, tenant: str | None = None) -> int:
    count = await session.scalar(
        sa.select(sa.func.count())
        .select_from(RoleMove)
        .where(RoleMove.state.in_(OPEN_MOVES), *_of_tenant(tenant))
    )
    return int(count or 0)


async def tenant_moves(
    session: AsyncSession, move_ids: list[uuid.UUID], *, tenant: str
) -> list[uuid.UUID]:
    """Those of ``move_ids`` that move one of ``tenant``'s members, in their order."""
    if not move_ids:
        return []
    ours = set(
        await session.scalars(
            sa.select(RoleMove.id).where(RoleMove.id.in_(move_ids), *_of_tenant(tenant))
        )
    )
    return [move_id for move_id in move_ids if move_id in ours]


async def get_move(
    session: AsyncSession, move_id: uuid.UUID, *, tenant: str | None = None
) -> RoleMove:
    """The move ``move_id``; not found too when its member is not ``tenant``'s."""
    move = await session.scalar(
        sa.select(RoleMove).where(RoleMove.id == move_id, *_of_tenant(tenant))
    )
    if move is None:
        raise NotFoundError(f"role move {str(move_id)!r} not found")
    return move


async def list_moves(
    session: AsyncSession,
    *,
    state: MoveState | None,
    member_id: str | None,
    limit: int,
    offset: int,
    tenant: str | None = None,
) -> tuple[list[RoleMove], int]:
    """One page of moves, newest first, and the number matching; with ``tenant``, of the
    moves of that tenant's members only."""
    conditions = _of_tenant(tenant)
    if state is not None:
        conditions.append(RoleMove.state == state)
    if member_id is not None:
        conditions.append(RoleMove.member_id == member_id)
    count = await session.scalar(
        sa.select(sa.func.count()).select_from(RoleMove).where(*conditions)
    )
    rows = await session.scalars(
        sa.select(RoleMove)
        .where(*conditions)
        .order_by(RoleMove.created_at.desc(), RoleMove.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return list(rows), int(count or 0)
