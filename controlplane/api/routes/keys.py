"""API-key management (``/api/v1/keys``), admin only. The key is returned once, at creation."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response

from controlplane.api.deps import Admin, SessionDep
from controlplane.api.routes._params import Limit, Offset
from controlplane.db import utcnow
from controlplane.models import KeyRole
from controlplane.schemas.common import responses
from controlplane.schemas.keys import APIKeyCreate, APIKeyCreated, APIKeyPublic, APIKeysPublic
from controlplane.services import keys as service

__all__ = ["router"]

router = APIRouter(prefix="/keys", tags=["keys"])


@router.post("", status_code=201)
async def create_key(principal: Admin, session: SessionDep, body: APIKeyCreate) -> APIKeyCreated:
    """Mint a key. The response holds the key itself: store it now, it is never shown again."""
    key, secret = await service.create_key(
        session,
        name=body.name,
        role=body.role,
        tenant=body.tenant,
        actor=principal.actor,
        now=utcnow(),
    )
    return APIKeyCreated(**APIKeyPublic.model_validate(key).model_dump(), key=secret)


@router.get("")
async def list_keys(
    _: Admin,
    session: SessionDep,
    include_revoked: Annotated[bool, Query(description="also list revoked keys")] = False,
    role: KeyRole | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> APIKeysPublic:
    """Keys newest first, with prefix, role and last use (never the key or its hash)."""
    rows, count = await service.list_keys(
        session, include_revoked=include_revoked, role=role, limit=limit, offset=offset
    )
    return APIKeysPublic(data=[APIKeyPublic.model_validate(r) for r in rows], count=count)


@router.get("/{key_id}", responses=responses(404))
async def read_key(_: Admin, session: SessionDep, key_id: uuid.UUID) -> APIKeyPublic:
    return APIKeyPublic.model_validate(await service.get_key(session, key_id))


@router.delete("/{key_id}", status_code=204, responses=responses(404))
async def revoke_key(principal: Admin, session: SessionDep, key_id: uuid.UUID) -> Response:
    """Revoke a key at once (idempotent). The row stays, for the audit trail."""
    await service.revoke_key(session, key_id, actor=principal.actor, now=utcnow())
    return Response(status_code=204)
