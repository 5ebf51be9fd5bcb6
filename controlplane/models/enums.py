"""The closed vocabularies stored in the registry (as strings, checked by the database)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import sqlalchemy as sa

__all__ = [
    "CommandState",
    "FleetKind",
    "FleetRole",
    "FleetState",
    "MoveState",
    "Role",
    "SLOVantage",
    "enum_type",
]


class Role(StrEnum):
    """What an API key may do (see ``controlplane.api.auth`` for who satisfies what)."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"
    INGEST = "ingest"
    AGENT = "agent"


class SLOVantage(StrEnum):
    """Where an SLO is judged: as the client sees it (default) or inside the engine."""

    GATEWAY = "gateway"
    ENGINE = "engine"


class FleetKind(StrEnum):
    GATEWAY = "gateway"
    WORKER = "worker"


class FleetRole(StrEnum):
    """Which pool a worker serves (a gateway reports ``both``)."""

    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"


class FleetState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    DRAINED = "drained"
    DOWN = "down"


class CommandState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    ACKED = "acked"
    FAILED = "failed"
    EXPIRED = "expired"


class MoveState(StrEnum):
    """Where a role move stands (``controlplane.models.automation.RoleMove``)."""

    DRAINING = "draining"
    SWITCHING = "switching"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


def enum_type(enum_cls: type[StrEnum], name: str) -> sa.Enum:
    """A portable enum column: VARCHAR plus a named CHECK constraint, storing the values.

    Not a native PostgreSQL ENUM, so adding a value is a batch ``ALTER`` on both backends
    rather than a PostgreSQL-only ``ALTER TYPE``.
    """

    def values(cls: Any) -> list[str]:
        return [member.value for member in cls]

    return sa.Enum(
        enum_cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
        values_callable=values,
        validate_strings=True,
    )
