"""Audit-log reads (``/api/v1/audit``), admin only: who changed what, before and after."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from controlplane.api.deps import Admin, SessionDep
from controlplane.api.routes._params import FilterText, Limit, Offset, Timestamp
from controlplane.schemas.audit import AuditEntriesPublic, AuditEntryPublic
from controlplane.services import audit as service

__all__ = ["router"]

router = APIRouter(prefix="/audit", tags=["audit"])

Action = Annotated[str, Query(max_length=64, pattern=r"^[a-z_]+\.[a-z_]+$")]
TargetType = Annotated[str, Query(max_length=32, pattern=r"^[a-z_]+$")]


@router.get("")
async def list_audit(
    *,
    _: Admin,
    session: SessionDep,
    actor: Annotated[
        str | None,
        Query(max_length=300, pattern=r"^[^\x00]*$", description="prefix, e.g. key:<id> or cli"),
    ] = None,
    action: Action | None = None,
    target_type: TargetType | None = None,
    target_id: FilterText | None = None,
    since: Annotated[Timestamp | None, Query(description="inclusive, ISO 8601 with zone")] = None,
    until: Annotated[Timestamp | None, Query(description="exclusive, ISO 8601 with zone")] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> AuditEntriesPublic:
    """Entries newest first, e.g. ``?target_type=slo&target_id=<id>`` for one SLO's story."""
    where = service.AuditFilter(
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        since=since,
        until=until,
    )
    rows, count = await service.list_entries(session, where, limit=limit, offset=offset)
    return AuditEntriesPublic(data=[AuditEntryPublic.model_validate(r) for r in rows], count=count)
