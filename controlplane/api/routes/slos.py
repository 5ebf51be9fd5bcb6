"""SLO registry routes: CRUD, version history, OpenSLO import/export (``/api/v1/slos``).

Reads need ``viewer``; writes need ``operator``. A key scoped to a tenant sees and writes
only that tenant's SLOs.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from controlplane import openslo
from controlplane.api.deps import Operator, SessionDep, SettingsDep, Viewer
from controlplane.api.routes._params import FilterText, Limit, Offset, Ref
from controlplane.db import utcnow
from controlplane.errors import (
    InvalidInputError,
    UnsupportedMediaTypeError,
)
from controlplane.ingest import read_limited
from controlplane.schemas.common import NAME_PATTERN, responses
from controlplane.schemas.slo import (
    SLOApplied,
    SLOCreate,
    SLOImportResult,
    SLOPublic,
    SLOsPublic,
    SLOUpdate,
    SLOVersionPublic,
    SLOVersionsPublic,
)
from controlplane.services import slos as service

__all__ = ["YAML_MEDIA_TYPES", "router"]

router = APIRouter(prefix="/slos", tags=["slos"])

YAML_MEDIA_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
IncludeDeleted = Annotated[bool, Query(description="also return soft-deleted SLOs")]


class YAMLResponse(Response):
    media_type = "application/yaml"


_YAML_BODY = {
    "requestBody": {
        "required": True,
        "description": (
            "A YAML stream of SLOs, each document either an OpenSLO v1 `SLO` (see docs/api.md "
            "for the mapping) or Goodput's own form, whose schema is given here."
        ),
        "content": {"application/yaml": {"schema": {"$ref": "#/components/schemas/SLOCreate"}}},
    }
}
_YAML_OUT: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "An OpenSLO v1 SLO document",
        "content": {
            "application/yaml": {
                "schema": {
                    "type": "object",
                    "required": ["apiVersion", "kind", "metadata", "spec"],
                    "properties": {
                        "apiVersion": {"const": "openslo/v1"},
                        "kind": {"const": "SLO"},
                        "metadata": {"type": "object"},
                        "spec": {"type": "object"},
                    },
                }
            }
        },
    }
}


@router.post("", status_code=201, responses=responses(409))
async def create_slo(principal: Operator, session: SessionDep, body: SLOCreate) -> SLOPublic:
    """Create an SLO; ``warnings`` names the objectives it cannot measure at its vantage."""
    slo = await service.create_slo(
        session, body, actor=principal.actor, now=utcnow(), tenant=principal.tenant
    )
    return SLOPublic.model_validate(slo)


@router.get("")
async def list_slos(
    *,
    principal: Viewer,
    session: SessionDep,
    name_prefix: Annotated[str | None, Query(max_length=200, pattern=NAME_PATTERN)] = None,
    model: FilterText | None = None,
    tenant: FilterText | None = None,
    include_deleted: IncludeDeleted = False,
    limit: Limit = 50,
    offset: Offset = 0,
) -> SLOsPublic:
    """SLOs ordered by name; ``model``/``tenant`` match the selector's label exactly."""
    where = service.SLOFilter(
        name_prefix=name_prefix, model=model, tenant=tenant, include_deleted=include_deleted
    )
    rows, count = await service.list_slos(
        session, where, limit=limit, offset=offset, scope_tenant=principal.tenant
    )
    return SLOsPublic(data=[SLOPublic.model_validate(r) for r in rows], count=count)


@router.post(
    ":import",
    responses={**responses(409, 413, 415), 200: {"model": SLOImportResult}},
    openapi_extra=_YAML_BODY,
)
async def import_slos(
    principal: Operator, session: SessionDep, settings: SettingsDep, request: Request
) -> SLOImportResult:
    """Create or update (by name) every SLO of a YAML stream, all or nothing."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type not in YAML_MEDIA_TYPES:
        raise UnsupportedMediaTypeError(
            f"content-type must be one of {list(YAML_MEDIA_TYPES)}, got {media_type!r}"
        )
    # Refused as soon as the stream passes the limit (a chunked body too), never read whole.
    raw = await read_limited(
        request.stream(),
        content_length=request.headers.get("content-length"),
        content_encoding=None,
        max_bytes=settings.max_import_bytes,
        setting="max_import_bytes",
    )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"body must be UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    now = utcnow()
    applied: list[SLOApplied] = []
    # Off the event loop, bounded in depth and time (YAML parsing is CPU-bound).
    definitions = await asyncio.to_thread(openslo.parse_documents, text)
    for definition in definitions:
        action, slo = await service.apply_slo(
            session, definition, actor=principal.actor, now=now, tenant=principal.tenant
        )
        applied.append(SLOApplied(action=action, slo=SLOPublic.model_validate(slo)))
    return SLOImportResult(data=applied, count=len(applied))


@router.get("/{slo_ref}", responses=responses(404))
async def read_slo(
    principal: Viewer, session: SessionDep, slo_ref: Ref, include_deleted: IncludeDeleted = False
) -> SLOPublic:
    slo = await service.get_slo(
        session, slo_ref, include_deleted=include_deleted, tenant=principal.tenant
    )
    return SLOPublic.model_validate(slo)


@router.patch("/{slo_ref}", responses=responses(404, 409))
async def update_slo(
    principal: Operator, session: SessionDep, slo_ref: Ref, body: SLOUpdate
) -> SLOPublic:
    """Change the fields sent; bumps ``version`` and records history if anything changed.
    ``warnings`` names the objectives the SLO cannot measure at its vantage."""
    slo = await service.update_slo(
        session, slo_ref, body, actor=principal.actor, now=utcnow(), tenant=principal.tenant
    )
    return SLOPublic.model_validate(slo)


@router.delete("/{slo_ref}", status_code=204, responses=responses(404))
async def delete_slo(principal: Operator, session: SessionDep, slo_ref: Ref) -> Response:
    """Soft delete: the SLO leaves reads and frees its name; id, history and rollups stay."""
    await service.delete_slo(
        session, slo_ref, actor=principal.actor, now=utcnow(), tenant=principal.tenant
    )
    return Response(status_code=204)


@router.get("/{slo_ref}/versions", responses=responses(404))
async def list_versions(
    principal: Viewer, session: SessionDep, slo_ref: Ref, limit: Limit = 50, offset: Offset = 0
) -> SLOVersionsPublic:
    """The SLO's snapshots, newest first (also for a deleted SLO)."""
    rows, count = await service.list_versions(
        session, slo_ref, limit=limit, offset=offset, tenant=principal.tenant
    )
    return SLOVersionsPublic(data=[SLOVersionPublic.model_validate(r) for r in rows], count=count)


@router.get(
    "/{slo_ref}/openslo",
    response_class=Response,  # no JSON 200: errors stay JSON, the document is YAML
    responses={**responses(404), **_YAML_OUT},
)
async def export_openslo(
    principal: Viewer, session: SessionDep, slo_ref: Ref, include_deleted: IncludeDeleted = False
) -> Response:
    """The SLO as an OpenSLO v1 document (re-importable with ``POST /slos:import``)."""
    slo = await service.get_slo(
        session, slo_ref, include_deleted=include_deleted, tenant=principal.tenant
    )
    return YAMLResponse(openslo.export_yaml([SLOPublic.model_validate(slo)]))
