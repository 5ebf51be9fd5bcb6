"""One-time console sign-in links (``/api/v1/sessions``), role ``viewer`` or above.

``POST /api/v1/sessions/links`` returns a path (``/console/sign-in?link=...``) that signs a
browser in once as the calling key, within ``ttl_s`` (default 10 min). It lets a terminal
that holds a key (``make demo``, a script) hand the console to a browser without pasting the
key; the link is single-use and stored only as a hash (``controlplane.api.sessions``).
"""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter

from controlplane.api.deps import SessionDep, Viewer
from controlplane.api.sessions import sign_in_link
from controlplane.db import utcnow
from controlplane.errors import InvalidInputError
from controlplane.schemas.sessions import SignInLinkCreate, SignInLinkPublic
from controlplane.services.keys import AuthenticatedKey

__all__ = ["router"]

router = APIRouter(prefix="/sessions", tags=["sessions"])


@router.post("/links", status_code=201)
async def create_link(
    principal: Viewer, session: SessionDep, body: SignInLinkCreate
) -> SignInLinkPublic:
    """A one-time sign-in link for the calling key."""
    if principal.key_id is None or principal.role is None:
        raise InvalidInputError("a sign-in link needs an API key")
    now = utcnow()
    key = AuthenticatedKey(
        principal.key_id, principal.name, principal.role, principal.tenant, "", "", None
    )
    token = await sign_in_link(session, key, now=now, ttl_s=body.ttl_s)
    return SignInLinkPublic(
        path=f"/console/sign-in?link={token}", expires_at=now + timedelta(seconds=body.ttl_s)
    )
