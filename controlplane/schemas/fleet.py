"""Fleet wire models: what an agent registers and reports, and what viewers read.

The contract is :mod:`exporters.fleet` (its messages and enums); these pydantic models
validate the same fields at the API's edge, with the limits the registry stores.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from controlplane.schemas.common import Label, WireModel
from exporters.fleet import FleetKind, FleetState, PoolRole

__all__ = [
    "ENDPOINT_PATTERN",
    "MEMBER_ID_PATTERN",
    "FleetHeartbeat",
    "FleetMemberPublic",
    "FleetMembersPublic",
    "FleetRegister",
    "Load",
]

MEMBER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
MemberId = Annotated[str, Field(min_length=1, max_length=128, pattern=MEMBER_ID_PATTERN)]
# Printable ASCII, as RFC 3986 has it (anything else is percent-encoded). Spelled without
# \s, which means different characters to pydantic's regex engine and to JSON Schema's.
ENDPOINT_PATTERN = r"^https?://[!-~]+$"
Endpoint = Annotated[str, Field(min_length=1, max_length=500, pattern=ENDPOINT_PATTERN)]
MAX_LOAD_TEXT = 2000


def _load_value(value: object) -> bool | int | float | str:
    # Checked by hand, not as a union of types: one clear error instead of one per member,
    # and no lax coercion (a long digit string must not become a float).
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, str) and len(value) <= MAX_LOAD_TEXT and "\x00" not in value:
        return value
    raise ValueError(
        f"must be a boolean, a finite number or a string of at most {MAX_LOAD_TEXT} "
        "characters without NUL"
    )


LoadValue = Annotated[object, AfterValidator(_load_value)]
LOAD_KEY_PATTERN = r"^[A-Za-z0-9_.:-]+$"
LoadKey = Annotated[str, Field(min_length=1, max_length=64, pattern=LOAD_KEY_PATTERN)]
# The load report is opaque to the registry (the planner reads it); keep it small and flat.
# The schema is spelled out: pydantic would publish the key pattern as patternProperties,
# which lets other keys through in the schema although validation refuses them.
Load = Annotated[
    dict[LoadKey, LoadValue],
    Field(max_length=64),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": 64,
            "propertyNames": {"minLength": 1, "maxLength": 64, "pattern": LOAD_KEY_PATTERN},
            "additionalProperties": {
                "anyOf": [
                    {"type": "boolean"},
                    {"type": "integer"},
                    {"type": "number"},
                    {"type": "string", "maxLength": MAX_LOAD_TEXT, "pattern": "^[^\\x00]*$"},
                ]
            },
        }
    ),
]


class FleetRegister(WireModel):
    """An agent announcing its gateway or worker. Registering again updates the entry.
    ``tenant``: the tenant whose pool the member serves (validated as a key's tenant);
    without one the member is the cluster's, shared by every tenant."""

    id: MemberId
    kind: FleetKind
    endpoint: Endpoint
    model: Annotated[str, Field(max_length=200, pattern=r"^[^\x00]*$")] = ""
    role: PoolRole = PoolRole.BOTH
    state: FleetState = FleetState.STARTING
    load: Load = Field(default_factory=dict)
    tenant: Label | None = None


class FleetHeartbeat(WireModel):
    """Liveness plus the latest load; ``state`` changes the reported state when given."""

    state: FleetState | None = None
    load: Load = Field(default_factory=dict)


class FleetMemberPublic(BaseModel):
    """``stale`` is true when no heartbeat arrived within the heartbeat timeout; ``tenant``
    is ``None`` for a member of the cluster (shared)."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    kind: FleetKind
    endpoint: str
    model: str
    role: PoolRole
    state: FleetState
    last_heartbeat_at: datetime | None
    load: dict[str, Any]
    registered_at: datetime
    tenant: str | None = None
    stale: bool = False


class FleetMembersPublic(BaseModel):
    data: list[FleetMemberPublic]
    count: int
