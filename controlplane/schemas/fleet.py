"""Fleet wire models: what an agent registers and reports, and what viewers read."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from controlplane.models.enums import FleetKind, FleetRole, FleetState
from controlplane.schemas.common import Text, WireModel

__all__ = [
    "MEMBER_ID_PATTERN",
    "FleetHeartbeat",
    "FleetMemberPublic",
    "FleetMembersPublic",
    "FleetRegister",
    "Load",
]

MEMBER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
MemberId = Annotated[str, Field(min_length=1, max_length=128, pattern=MEMBER_ID_PATTERN)]
Endpoint = Annotated[str, Field(min_length=1, max_length=500, pattern=r"^https?://[^\s\x00]+$")]
LoadValue = float | int | bool | Text
# The load report is opaque to the registry (the planner reads it); keep it small and flat.
Load = Annotated[
    dict[Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")], LoadValue],
    Field(max_length=64),
]


class FleetRegister(WireModel):
    """An agent announcing its gateway or worker. Registering again updates the entry."""

    id: MemberId
    kind: FleetKind
    endpoint: Endpoint
    model: Annotated[str, Field(max_length=200, pattern=r"^[^\x00]*$")] = ""
    role: FleetRole = FleetRole.BOTH
    state: FleetState = FleetState.STARTING
    load: Load = Field(default_factory=dict)


class FleetHeartbeat(WireModel):
    """Liveness plus the latest load; ``state`` changes the reported state when given."""

    state: FleetState | None = None
    load: Load = Field(default_factory=dict)


class FleetMemberPublic(BaseModel):
    """``stale`` is true when no heartbeat arrived within the heartbeat timeout."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    kind: FleetKind
    endpoint: str
    model: str
    role: FleetRole
    state: FleetState
    last_heartbeat_at: datetime | None
    load: dict[str, Any]
    registered_at: datetime
    stale: bool = False


class FleetMembersPublic(BaseModel):
    data: list[FleetMemberPublic]
    count: int
