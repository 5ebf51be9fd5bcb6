"""The closed vocabularies stored in the registry (as strings, checked by the database).

The fleet's (``FleetKind``, ``PoolRole``, ``FleetState``) are the contract's, defined in
:mod:`exporters.fleet`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import sqlalchemy as sa

from exporters.fleet import FleetKind, FleetState, PoolRole

__all__ = [
    "CommandState",
    "FleetKind",
    "FleetState",
    "KeyRole",
    "MoveState",
    "PoolRole",
    "SLOVantage",
    "enum_type",
]


class KeyRole(StrEnum):
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
