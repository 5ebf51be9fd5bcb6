"""Command wire models: what an operator issues, what an agent polls and acknowledges, and
what viewers read.

The issue body is a union discriminated by ``kind`` whose payload schemas spell out what
``exporters.commands`` accepts, so a body valid by the published schema is a valid command.
The poll answer is the ``exporters.commands`` JSON contract (``command_to_json``) itself.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from controlplane.models.enums import CommandState
from controlplane.schemas.common import WireModel
from controlplane.schemas.fleet import MemberId
from exporters.commands import MAX_DETAIL_CHARS, CommandKind, Pool
from exporters.fleet import PoolRole

__all__ = [
    "MAX_TTL_S",
    "AckWire",
    "CommandIssue",
    "CommandPublic",
    "CommandWire",
    "CommandsPublic",
    "CommandsWire",
]

# The largest integer a float holds exactly: JSON Schema tools compare bounds as floats,
# so a larger bound (2**63 - 1) would publish values above it as schema-valid.
MAX_INT = 2**53 - 1
MAX_TTL_S = 86_400.0
# Payload strings land in JSON columns; PostgreSQL refuses NUL in them.
_NO_NUL = r"^[^\x00]*$"
Name = Annotated[str, Field(min_length=1, max_length=256, pattern=_NO_NUL)]


def _json_number(value: object) -> object:
    # As the schema says: a JSON ``true`` is not 1 and ``"1"`` is not a number (pydantic's
    # lax mode would take both), while ``3.0`` is the integer 3 (strict mode would refuse).
    if isinstance(value, bool | str):
        raise ValueError(f"must be a number, got {value!r}")
    return value


# The validator comes after the bounds: before them, pydantic would publish the bounds as
# "ge"/"le" rather than JSON Schema's "minimum"/"maximum".
NUMBER = BeforeValidator(_json_number)
Seconds = Annotated[float, Field(gt=0, le=MAX_TTL_S), NUMBER]
Bool = Annotated[bool, Field(strict=True)]


def _key_pattern_as_property_names(schema: dict[str, Any]) -> None:
    # pydantic publishes the key pattern as patternProperties, which lets other keys through
    # in the schema although validation refuses them; say it with propertyNames instead.
    ((pattern, values),) = schema.pop("patternProperties").items()
    schema["propertyNames"]["pattern"] = pattern
    schema["additionalProperties"] = values


# exporters.admission's number fields: ratios in (0, 1], rates > 0, amounts >= 0.
Ratio = Annotated[float, Field(gt=0, le=1), NUMBER]
Positive = Annotated[float, Field(gt=0), NUMBER]
NonNegative = Annotated[float, Field(ge=0), NUMBER]


class ClassPolicyIn(WireModel):
    shed_order: Annotated[int, Field(ge=0, le=1_000_000), NUMBER] = 0
    sheddable: Bool = True
    ttft_s: Seconds | None = None
    headroom_ratio: Ratio = 1.0


class SLOAdmissionIn(WireModel):
    ttft_s: Seconds | None = None
    itl_s: Seconds | None = None
    burn_rate: NonNegative = 0.0
    margin_ratio: Ratio = 1.0


class AdmissionModelIn(WireModel):
    prefill_tokens_per_s: Positive
    instance_prefill_tokens_per_s: Annotated[
        dict[Name, Positive],
        Field(max_length=4096, json_schema_extra=_key_pattern_as_property_names),
    ] = Field(default_factory=dict)
    kv_handoff_s: NonNegative = 0.0
    itl_base_s: NonNegative = 0.01
    itl_per_stream_s: NonNegative = 0.0
    itl_per_context_token_s: NonNegative = 0.0
    max_decode_batch: Annotated[int, Field(ge=1, le=2**31 - 1), NUMBER] = 256
    mean_decode_s: Positive = 5.0
    mean_context_tokens: NonNegative = 1024.0


class AdmissionPolicyIn(WireModel):
    """``exporters.admission.AdmissionPolicy`` (docs/admission.md)."""

    version: Annotated[int, Field(ge=0, le=MAX_INT), NUMBER]
    ttl_s: Seconds
    fallback_max_concurrency: Annotated[int, Field(ge=1, le=2**31 - 1), NUMBER]
    classes: Annotated[
        dict[Name, ClassPolicyIn],
        Field(max_length=64, json_schema_extra=_key_pattern_as_property_names),
    ] = Field(default_factory=dict)
    slos: Annotated[
        dict[Name, SLOAdmissionIn],
        Field(max_length=1024, json_schema_extra=_key_pattern_as_property_names),
    ] = Field(default_factory=dict)
    model: AdmissionModelIn | None = None
    tenant_weights: Annotated[
        dict[Name, Positive],
        Field(max_length=4096, json_schema_extra=_key_pattern_as_property_names),
    ] = Field(default_factory=dict)
    over_share_ratio: Ratio = 0.8
    #: Prompt-length class bounds (strictly ascending; the gateway refuses others).
    prompt_class_bounds: Annotated[
        list[Annotated[int, Field(ge=1, le=2**31 - 1), NUMBER]], Field(max_length=16)
    ] = Field(default_factory=list)
    availability_floor: Annotated[float, Field(ge=0, lt=1), NUMBER] = 0.0


class SetAdmissionPolicyPayload(WireModel):
    policy: AdmissionPolicyIn


class SetRolePayload(WireModel):
    role: PoolRole


class SetPoolMembershipPayload(WireModel):
    pool: Pool
    instances: Annotated[list[Name], Field(max_length=256, json_schema_extra={"uniqueItems": True})]


class EmptyPayload(WireModel):
    """``drain`` and ``resume`` carry nothing."""


class _Issue(WireModel):
    """``id``: optional client-chosen idempotency key (a retry with the same id and body
    answers the existing command). ``version``: the desired-state version of
    ``(target, kind)``; omitted, one above the highest issued. ``ttl_s``: validity."""

    id: uuid.UUID | None = None
    target: MemberId
    version: Annotated[int, Field(ge=0, le=MAX_INT), NUMBER] | None = None
    ttl_s: Seconds = 300.0


class SetAdmissionPolicyIssue(_Issue):
    kind: Literal[CommandKind.SET_ADMISSION_POLICY]
    payload: SetAdmissionPolicyPayload


class SetRoleIssue(_Issue):
    kind: Literal[CommandKind.SET_ROLE]
    payload: SetRolePayload


class SetPoolMembershipIssue(_Issue):
    kind: Literal[CommandKind.SET_POOL_MEMBERSHIP]
    payload: SetPoolMembershipPayload


class DrainIssue(_Issue):
    kind: Literal[CommandKind.DRAIN]
    payload: EmptyPayload = Field(default_factory=EmptyPayload)


class ResumeIssue(_Issue):
    kind: Literal[CommandKind.RESUME]
    payload: EmptyPayload = Field(default_factory=EmptyPayload)


CommandIssue = Annotated[
    SetAdmissionPolicyIssue | SetRoleIssue | SetPoolMembershipIssue | DrainIssue | ResumeIssue,
    Field(discriminator="kind"),
]


class CommandWire(BaseModel):
    """``exporters.commands.command_to_json``: what an agent receives."""

    v: int
    id: str
    kind: CommandKind
    target: str
    version: int
    issued_time_ns: int
    expires_time_ns: int
    payload: dict[str, Any]


class CommandsWire(BaseModel):
    data: list[CommandWire]
    count: int


class AckWire(WireModel):
    """``exporters.commands.CommandAck.to_json()``: an agent's answer to one delivery."""

    v: Annotated[int, Field(ge=1, le=1), NUMBER]  # exporters.commands.COMMAND_VERSION
    command_id: uuid.UUID
    target: MemberId
    ok: Bool
    detail: Annotated[str, Field(max_length=MAX_DETAIL_CHARS, pattern=_NO_NUL)]
    # Nanoseconds since the epoch exceed MAX_INT; exporters.commands checks the int64 range.
    acked_time_ns: Annotated[int, Field(ge=0), NUMBER]


class CommandPublic(BaseModel):
    """A command and where it stands; ``ack`` is the first acknowledgement received."""

    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    kind: str
    target: str
    version: int
    payload: dict[str, Any]
    state: CommandState
    attempts: int
    created_at: datetime
    delivered_at: datetime | None
    acked_at: datetime | None
    expires_at: datetime | None
    ack: AckWire | None = None


class CommandsPublic(BaseModel):
    data: list[CommandPublic]
    count: int
