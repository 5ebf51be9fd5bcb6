"""Commands to fleet members: issue (operators), deliver and acknowledge (agents), read.

Life of a command: ``pending`` → ``delivered`` (a poll returned it; ``attempts`` counts the
polls) → ``acked`` (the target applied it) or ``failed`` (the target refused it). A command
whose ``expires_at`` has passed before it was acknowledged becomes ``expired`` at the next
poll and is never delivered again. A delivered but unacknowledged command is delivered
again after :data:`REDELIVER_AFTER` (the agent may have died between poll and ack); that is
harmless because a target applies an id at most once and acknowledges every delivery.

Issuing and acknowledging are audited (``command.issue``, ``command.ack``); polls are not
(agents poll every few seconds). Acknowledgements are idempotent: once a command is acked
or failed, later acks (a retried POST, the ack of a re-delivery) answer the command as it
stands and change nothing, so the first answer wins.

:data:`COMMAND_COUNTS` counts, per kind, the commands that entered each state (``pending``:
issued; ``delivered``: every delivery, re-deliveries too; ``acked``, ``failed``;
``expired``: found expired at its target's next poll), once the transaction that made the
change commits: a rolled-back issue counts nothing. The control plane exports them as
``goodput_commands_total{kind, state}`` (:mod:`controlplane.runtime.loop_metrics`).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from controlplane.errors import ConflictError, InvalidInputError, NotFoundError
from controlplane.models import Command, CommandState, FleetMember
from controlplane.schemas.commands import AckWire, CommandIssue, CommandPublic
from controlplane.services import audit
from controlplane.services.fleet import get_member, tenant_members, visible
from exporters.commands import Command as WireCommand
from exporters.commands import CommandAck, CommandError, CommandKind, command_to_json

__all__ = [
    "COMMAND_COUNTS",
    "MAX_DELIVERY",
    "NO_EXPIRY_TTL",
    "REDELIVER_AFTER",
    "CommandCounts",
    "CommandFilter",
    "acknowledge",
    "command_public",
    "deliver",
    "get_command",
    "issue",
    "issue_automatic",
    "issue_for_move",
    "list_commands",
    "to_wire",
]

REDELIVER_AFTER = timedelta(seconds=30)
MAX_DELIVERY = 100  # commands per poll; the rest come at the next poll
# A command stored without expires_at (by a future planner) still needs one on the wire.
NO_EXPIRY_TTL = timedelta(days=1)
_OPEN = (CommandState.PENDING, CommandState.DELIVERED)
_DONE = (CommandState.ACKED, CommandState.FAILED)
_PENDING_COUNTS = "goodput.command_counts"


class CommandCounts:
    """Commands that entered each state, per ``(kind, state)``; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}

    def add(self, kind: str, state: str, count: int = 1) -> None:
        with self._lock:
            self._counts[kind, state] = self._counts.get((kind, state), 0) + count

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


COMMAND_COUNTS = CommandCounts()


def _count(session: AsyncSession, kind: str, state: CommandState, count: int = 1) -> None:
    """Count ``count`` commands of ``kind`` entering ``state`` when ``session`` commits."""
    session.info.setdefault(_PENDING_COUNTS, []).append((kind, state.value, count))


@event.listens_for(Session, "after_commit")
def _committed(session: Session) -> None:
    for kind, state, count in session.info.pop(_PENDING_COUNTS, ()):
        COMMAND_COUNTS.add(kind, state, count)


@event.listens_for(Session, "after_rollback")
def _rolled_back(session: Session) -> None:
    session.info.pop(_PENDING_COUNTS, None)


def _ns(moment: datetime) -> int:
    delta = moment - datetime(1970, 1, 1, tzinfo=moment.tzinfo)
    return (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1_000


def to_wire(command: Command) -> dict[str, Any]:
    """The ``exporters.commands`` JSON of a stored command (validated on the way)."""
    expires_at = command.expires_at or command.created_at + NO_EXPIRY_TTL
    wire = WireCommand(
        id=str(command.id),
        kind=command.kind,  # type: ignore[arg-type]  # checked against CommandKind
        target=command.target,
        version=command.version,
        issued_time_ns=_ns(command.created_at),
        expires_time_ns=_ns(expires_at),
        payload=command.payload,
    )
    return command_to_json(wire)


def command_public(command: Command) -> CommandPublic:
    public = CommandPublic.model_validate(command)
    ack = (command.observed_effect or {}).get("ack")
    public.ack = None if ack is None else AckWire.model_validate(ack)
    return public


def _snapshot(command: Command) -> dict[str, Any]:
    return command_public(command).model_dump(mode="json")


def _request(body: CommandIssue) -> dict[str, Any]:
    return body.model_dump(mode="json", exclude={"id"})


async def _store(session: AsyncSession, command: Command, *, actor: str, now: datetime) -> None:
    """Persist a new command and audit its issue (``command.issue``), in the caller's
    transaction."""
    session.add(command)
    await session.flush()
    _count(session, command.kind, CommandState.PENDING)
    await _audit(session, command, "command.issue", before=None, actor=actor, now=now)


async def _audit(
    session: AsyncSession,
    command: Command,
    action: str,
    *,
    before: dict[str, Any] | None,
    actor: str,
    now: datetime,
) -> None:
    """Audit ``action`` on ``command`` (its snapshot before and now)."""
    await audit.record(
        session,
        actor=actor,
        action=action,
        target_type="command",
        target_id=str(command.id),
        before=before,
        after=_snapshot(command),
        now=now,
    )


async def get_command(
    session: AsyncSession, command_id: uuid.UUID, *, tenant: str | None = None
) -> Command:
    """The command ``command_id``; not found too when its target is not ``tenant``'s
    (a scoped key reads only the commands of its tenant's members)."""
    command = await session.get(Command, command_id)
    if command is not None and tenant is not None:
        member = await session.get(FleetMember, command.target)
        if member is None or not visible(member, tenant):
            command = None
    if command is None:
        raise NotFoundError(f"command {str(command_id)!r} not found")
    return command


async def issue(
    session: AsyncSession, body: CommandIssue, *, actor: str, now: datetime
) -> tuple[Command, bool]:
    """Store a command for ``body.target``; returns it and whether it is new.

    With a client-given ``id`` already stored: the same body answers the stored command
    (``False``), a different one is a :class:`ConflictError`. The payload is checked by
    ``exporters.commands`` too (422 naming the field); an unknown target is a 404.
    """
    request = _request(body)
    if body.id is not None:
        existing = await session.get(Command, body.id)
        if existing is not None:
            if (existing.evidence or {}).get("request") != request:
                raise ConflictError(
                    f"command {str(body.id)!r} exists with a different body; "
                    "issue a new command with a new id"
                )
            return existing, False
    await get_member(session, body.target)
    version = body.version
    if version is None:
        version = await _next_version(session, body.target, body.kind.value)
    command_id = body.id or uuid.uuid4()
    try:
        wire = WireCommand.new(
            body.kind,
            body.target,
            request["payload"],
            version=version,
            now_ns=_ns(now),
            ttl_s=body.ttl_s,
        )
    except CommandError as exc:
        raise InvalidInputError(str(exc), loc=("body", *exc.field.split("."))) from exc
    command = Command(
        id=command_id,
        target=body.target,
        kind=body.kind.value,
        payload=command_to_json(wire)["payload"],
        state=CommandState.PENDING,
        evidence={"source": "manual", "actor": actor, "request": request},
        created_at=now,
        expires_at=now + timedelta(seconds=body.ttl_s),
        attempts=0,
        version=version,
    )
    await _store(session, command, actor=actor, now=now)
    return command, True


async def deliver(session: AsyncSession, member_id: str, *, now: datetime) -> list[Command]:
    """The commands due for ``member_id`` (oldest first), marked delivered; open commands
    past their expiry become ``expired`` first. An unknown member has none."""
    expired = await session.scalars(
        sa.update(Command)
        .where(
            Command.target == member_id,
            Command.state.in_(_OPEN),
            Command.expires_at.is_not(None),
            Command.expires_at <= now,
        )
        .values(state=CommandState.EXPIRED)
        .returning(Command.kind)
        .execution_options(synchronize_session=False)
    )
    for kind in expired.all():
        _count(session, kind, CommandState.EXPIRED)
    due = sa.or_(
        Command.state == CommandState.PENDING,
        sa.and_(
            Command.state == CommandState.DELIVERED,
            Command.delivered_at <= now - REDELIVER_AFTER,
        ),
    )
    rows = list(
        await session.scalars(
            sa.select(Command)
            .where(Command.target == member_id, due)
            .order_by(Command.created_at, Command.id)
            .limit(MAX_DELIVERY)
            .execution_options(populate_existing=True)
        )
    )
    for command in rows:
        command.state = CommandState.DELIVERED
        command.delivered_at = now
        command.attempts += 1
        _count(session, command.kind, CommandState.DELIVERED)
    await session.flush()
    return rows


async def acknowledge(
    session: AsyncSession,
    member_id: str,
    command_id: uuid.UUID,
    body: AckWire,
    *,
    actor: str,
    now: datetime,
) -> Command:
    """Record ``member_id``'s ack of ``command_id``: ``acked`` if ``ok``, else ``failed``.

    404 for an unknown command or one for another member; 422 when the body's
    ``command_id`` or ``target`` disagree with the path. A command already acked or failed
    is answered unchanged.
    """
    command = await session.get(Command, command_id)
    if command is None or command.target != member_id:
        raise NotFoundError(f"command {str(command_id)!r} for fleet member {member_id!r} not found")
    try:
        ack = CommandAck.from_json(body.model_dump(mode="json"))
    except CommandError as exc:
        raise InvalidInputError(str(exc), loc=("body", *exc.field.split("."))) from exc
    if ack.command_id != str(command_id):
        raise InvalidInputError(
            f"command_id must be the command in the path ({str(command_id)!r}), "
            f"got {ack.command_id!r}",
            loc=("body", "command_id"),
        )
    if ack.target != member_id:
        raise InvalidInputError(
            f"target must be the member in the path ({member_id!r}), got {ack.target!r}",
            loc=("body", "target"),
        )
    if command.state in _DONE:
        return command
    before = _snapshot(command)
    command.state = CommandState.ACKED if ack.ok else CommandState.FAILED
    _count(session, command.kind, command.state)
    command.acked_at = now
    command.observed_effect = {**(command.observed_effect or {}), "ack": ack.to_json()}
    await session.flush()
    await _audit(session, command, "command.ack", before=before, actor=actor, now=now)
    return command


async def _next_version(session: AsyncSession, target: str, kind: str) -> int:
    highest = await session.scalar(
        sa.select(sa.func.max(Command.version)).where(
            Command.target == target, Command.kind == kind
        )
    )
    return int(highest or 0) + 1


async def issue_for_move(
    session: AsyncSession,
    *,
    target: str,
    kind: CommandKind,
    payload: dict[str, Any],
    move_id: uuid.UUID,
    evidence: dict[str, Any],
    predicted_effect: dict[str, Any] | None,
    actor: str,
    now: datetime,
    ttl_s: float,
) -> Command:
    """Store one command of a role move (the planner's or an operator's), with the
    evidence and predicted effect beside it; audited as ``command.issue`` like any other.
    The version is one above the highest issued for ``(target, kind)``."""
    version = await _next_version(session, target, kind.value)
    return await issue_automatic(
        session,
        target=target,
        kind=kind,
        payload=payload,
        version=version,
        evidence=evidence,
        predicted_effect=predicted_effect,
        move_id=move_id,
        actor=actor,
        now=now,
        ttl_s=ttl_s,
    )


async def issue_automatic(
    session: AsyncSession,
    *,
    target: str,
    kind: CommandKind,
    payload: dict[str, Any],
    version: int,
    evidence: dict[str, Any],
    actor: str,
    now: datetime,
    ttl_s: float,
    predicted_effect: dict[str, Any] | None = None,
    move_id: uuid.UUID | None = None,
) -> Command:
    """Store one command a control loop decided (admission policy, role move) at
    ``version``, with its evidence and predicted effect; audited as ``command.issue``."""
    wire = WireCommand.new(kind, target, payload, version=version, now_ns=_ns(now), ttl_s=ttl_s)
    command = Command(
        id=uuid.UUID(wire.id),
        target=target,
        kind=kind.value,
        payload=command_to_json(wire)["payload"],
        state=CommandState.PENDING,
        evidence=evidence,
        predicted_effect=predicted_effect,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
        attempts=0,
        version=version,
        move_id=move_id,
    )
    await _store(session, command, actor=actor, now=now)
    return command


@dataclass(frozen=True, slots=True)
class CommandFilter:
    target: str | None = None
    state: CommandState | None = None
    kind: str | None = None


async def list_commands(
    session: AsyncSession,
    where: CommandFilter,
    *,
    limit: int,
    offset: int,
    tenant: str | None = None,
) -> tuple[list[Command], int]:
    """One page of commands, newest first, and the number matching; with ``tenant``, of
    the commands whose target is one of that tenant's members only."""
    conditions: list[sa.ColumnElement[bool]] = []
    if tenant is not None:
        conditions.append(Command.target.in_(tenant_members(tenant)))
    if where.target is not None:
        conditions.append(Command.target == where.target)
    if where.state is not None:
        conditions.append(Command.state == where.state)
    if where.kind is not None:
        conditions.append(Command.kind == where.kind)
    count = await session.scalar(sa.select(sa.func.count()).select_from(Command).where(*conditions))
    rows = await session.scalars(
        sa.select(Command)
        .where(*conditions)
        .order_by(Command.created_at.desc(), Command.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return list(rows), int(count or 0)
