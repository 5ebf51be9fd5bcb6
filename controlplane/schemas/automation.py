"""Automation wire models: the planner's switch, role pins, role moves, the last tick."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.models.enums import MoveState, PoolRole
from controlplane.schemas.common import Text, WireModel
from controlplane.schemas.fleet import MemberId

__all__ = [
    "AutomationPublic",
    "AutomationStatus",
    "MoveCreate",
    "MovePublic",
    "MovesPublic",
    "PauseBody",
    "PinBody",
    "PinPublic",
    "TickPublic",
]

#: The roles a move can take a member to.
MoveRole = Literal[PoolRole.PREFILL, PoolRole.DECODE]


class PauseBody(WireModel):
    """Why the planner is paused or resumed (kept with the switch and in the audit log)."""

    reason: Text = ""


class PinBody(WireModel):
    """The role the member keeps; the planner never moves a pinned member."""

    role: PoolRole
    reason: Text = ""


class MoveCreate(WireModel):
    """An operator's role move: drain ``member_id``, set its role to ``role``, resume it.
    ``id``: optional idempotency key (the same id and body answer the stored move)."""

    id: uuid.UUID | None = None
    member_id: MemberId
    role: MoveRole
    reason: Text = ""


class AutomationPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    paused: bool
    reason: str
    updated_by: str
    updated_at: datetime | None


class PinPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    member_id: str
    role: PoolRole
    reason: str
    actor: str
    created_at: datetime


class MovePublic(BaseModel):
    """A role move, where it stands, its evidence, prediction and observed effect, and the
    ids of the commands that carry it out (``GET /commands/{id}``)."""

    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    member_id: str
    from_role: PoolRole
    to_role: PoolRole
    mode: str
    source: str
    state: MoveState
    detail: str
    evidence: dict[str, Any]
    predicted_effect: dict[str, Any]
    observed_effect: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    observe_at: datetime | None
    command_ids: list[uuid.UUID] = Field(default_factory=list)


class MovesPublic(BaseModel):
    data: list[MovePublic]
    count: int


class TickPublic(BaseModel):
    """What the last planner tick did (``None`` before the first)."""

    time: datetime
    paused: bool
    reason: str
    moves_started: list[uuid.UUID]
    moves_advanced: int
    observed: int
    duration_ms: float
    evidence: dict[str, Any] = Field(default_factory=dict)


class AutomationStatus(BaseModel):
    planner: AutomationPublic
    enabled: bool
    interval_s: float
    pins: list[PinPublic]
    open_moves: Annotated[int, Field(ge=0)]
    last_tick: TickPublic | None
