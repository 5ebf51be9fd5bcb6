"""The registry's tables (SQLAlchemy 2.0 typed models). ORM classes are never wire types:
``controlplane.schemas`` holds those.

``SCHEMA_REVISION`` is the Alembic revision these models describe; ``/ready`` reports not ready
while the database is at another one, and a test checks it is the migrations' head.
"""

from controlplane.db import Base
from controlplane.models.agent_binding import AgentBinding
from controlplane.models.api_key import APIKey
from controlplane.models.audit import AuditLog
from controlplane.models.automation import Automation, RoleMove, RolePin
from controlplane.models.console_session import ConsoleSession
from controlplane.models.enums import (
    CommandState,
    FleetKind,
    FleetState,
    KeyRole,
    MoveState,
    PoolRole,
    SLOVantage,
)
from controlplane.models.fleet import Command, FleetMember
from controlplane.models.leader_lease import LeaderLease
from controlplane.models.rollup import FleetLogEntry, GoodputRollup, WalCheckpoint
from controlplane.models.slo import SLO, SLOVersion

__all__ = [
    "SCHEMA_REVISION",
    "SLO",
    "APIKey",
    "AgentBinding",
    "AuditLog",
    "Automation",
    "Base",
    "Command",
    "CommandState",
    "ConsoleSession",
    "FleetKind",
    "FleetLogEntry",
    "FleetMember",
    "FleetState",
    "GoodputRollup",
    "KeyRole",
    "LeaderLease",
    "MoveState",
    "PoolRole",
    "RoleMove",
    "RolePin",
    "SLOVantage",
    "SLOVersion",
    "WalCheckpoint",
]

SCHEMA_REVISION = "0010_fleet_member_tenant"
