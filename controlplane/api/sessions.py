"""Console sign-in sessions: an API key exchanged for an HttpOnly cookie, with a CSRF token.

The console signs in by posting an API key once (:func:`sign_in`); the key's holder then
carries a random token in the ``goodput_session`` cookie (HttpOnly, SameSite=Strict, Secure
when served over HTTPS, ``Max-Age`` = the session's life) instead of the key. Only the
token's SHA-256 is stored (``console_session``), so the table leaks no usable credential.

Every API route accepts the cookie where it accepts a bearer key
(``controlplane.api.auth``): the same role matrix applies, to the key the session was
opened with. A request that changes anything (any method but GET, HEAD, OPTIONS) must also
send the session's CSRF token in ``X-CSRF-Token`` (the console reads it from its page);
without it the request is refused with 403. A cross-site page can neither read that token
nor, with SameSite=Strict, send the cookie at all: two independent defences.

A session ends when it expires (``Settings.console_session_ttl_s``), when its holder signs
out (the row is deleted, so a copied cookie stops working everywhere), or when its key is
revoked (checked on every request, through the database).

Example::

    token, opened = await sign_in(session, key, now=utcnow(), ttl_s=8 * 3600)
    response.set_cookie(COOKIE_NAME, token, **cookie_options(request, ttl_s))
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NoReturn

import sqlalchemy as sa
from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db import utcnow
from controlplane.errors import ForbiddenError, UnauthenticatedError
from controlplane.models import APIKey, ConsoleSession, KeyRole
from controlplane.services import audit
from controlplane.services.keys import AuthenticatedKey

__all__ = [
    "COOKIE_NAME",
    "CSRF_HEADER",
    "SAFE_METHODS",
    "OpenSession",
    "console_session",
    "cookie_options",
    "find_session",
    "redeem_link",
    "refuse",
    "sign_in",
    "sign_in_link",
    "sign_out",
]

logger = logging.getLogger(__name__)

COOKIE_NAME = "goodput_session"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True, slots=True)
class OpenSession:
    """A live session and the key it speaks for (``id``, ``name``, ``role``, ``tenant``:
    the key's, as on :class:`~controlplane.services.keys.AuthenticatedKey`)."""

    id: uuid.UUID  # the key's
    name: str  # the key's
    role: KeyRole
    tenant: str | None
    csrf_token: str
    expires_at: datetime

    def csrf_matches(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented, self.csrf_token)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def cookie_options(request: Request, ttl_s: float) -> dict[str, Any]:
    """``set_cookie`` arguments: HttpOnly, SameSite=Strict, path ``/``, Secure over HTTPS."""
    return {
        "max_age": int(ttl_s),
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
        "path": "/",
    }


async def sign_in(
    session: AsyncSession,
    key: AuthenticatedKey,
    *,
    now: datetime,
    ttl_s: float,
) -> tuple[str, OpenSession]:
    """Open a session for a live, authenticated ``key`` (audited as ``session.create``);
    returns the cookie's token (shown once, never stored) and the session."""
    token = secrets.token_urlsafe(32)
    row = ConsoleSession(
        token_hash=_hash(token),
        key_id=key.id,
        csrf_token=secrets.token_urlsafe(32),
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
    )
    session.add(row)
    after = {"expires_at": row.expires_at.isoformat()}
    await _audit(session, key, "session.create", after, now)
    opened = OpenSession(key.id, key.name, key.role, key.tenant, row.csrf_token, row.expires_at)
    return token, opened


async def sign_in_link(
    session: AsyncSession, key: AuthenticatedKey, *, now: datetime, ttl_s: float
) -> str:
    """A one-time sign-in token for ``key`` (``/console/sign-in?link=<token>``), valid
    ``ttl_s``: :func:`redeem_link` exchanges it once for a session. Stored like a session
    but with no CSRF token, so it never passes as a session cookie."""
    token = secrets.token_urlsafe(32)
    session.add(
        ConsoleSession(
            token_hash=_hash(token),
            key_id=key.id,
            csrf_token="",
            created_at=now,
            expires_at=now + timedelta(seconds=ttl_s),
        )
    )
    return token


async def redeem_link(
    session: AsyncSession, link: str, *, now: datetime, ttl_s: float
) -> tuple[str, OpenSession] | None:
    """Exchange a live one-time link for a new session (the link is deleted), or ``None``."""
    found = await find_session(session, link, now=now, link=True)
    if found is None:
        return None
    await session.execute(sa.delete(ConsoleSession).where(ConsoleSession.token_hash == _hash(link)))
    key = AuthenticatedKey(found.id, found.name, found.role, found.tenant, "", "", None)
    return await sign_in(session, key, now=now, ttl_s=ttl_s)


async def find_session(
    session: AsyncSession, token: str, *, now: datetime, link: bool = False
) -> OpenSession | None:
    """The live session (or, with ``link``, one-time link) of ``token`` whose key is not
    revoked, or ``None``."""
    if not token or len(token) > 100:
        return None
    kind = ConsoleSession.csrf_token == "" if link else ConsoleSession.csrf_token != ""
    row = (
        await session.execute(
            sa.select(ConsoleSession, APIKey)
            .join(APIKey, APIKey.id == ConsoleSession.key_id)
            .where(
                ConsoleSession.token_hash == _hash(token),
                ConsoleSession.expires_at > now,
                APIKey.revoked_at.is_(None),
                kind,
            )
        )
    ).first()
    if row is None:
        return None
    opened, key = row
    return OpenSession(key.id, key.name, key.role, key.tenant, opened.csrf_token, opened.expires_at)


async def sign_out(session: AsyncSession, token: str, *, now: datetime) -> bool:
    """End the session of ``token`` (audited as ``session.delete``); also drops expired
    sessions. Returns whether a live session was ended."""
    opened = await find_session(session, token, now=now)
    await session.execute(
        sa.delete(ConsoleSession).where(
            (ConsoleSession.token_hash == _hash(token)) | (ConsoleSession.expires_at <= now)
        )
    )
    if opened is None:
        return False
    await _audit(session, opened, "session.delete", None, now)
    return True


async def _audit(
    session: AsyncSession,
    key: AuthenticatedKey | OpenSession,
    action: str,
    after: dict[str, Any] | None,
    now: datetime,
) -> None:
    await audit.record(
        session,
        actor=f"key:{key.id}:{key.name}",
        action=action,
        target_type="api_key",
        target_id=str(key.id),
        before=None,
        after=after,
        now=now,
    )


async def console_session(request: Request) -> OpenSession:
    """The session of the request's cookie, for a route that got no bearer key: 401 when
    there is none or it ended; 403 (audited) for a mutation without its CSRF token."""
    token = request.cookies.get(COOKIE_NAME)
    if not token:
        raise UnauthenticatedError("missing API key: send 'Authorization: Bearer <key>'")
    async with request.app.state.sessions() as session:
        opened = await find_session(session, token, now=utcnow())
    if opened is None:
        raise UnauthenticatedError("console session expired or ended: sign in again")
    if request.method not in SAFE_METHODS and not opened.csrf_matches(
        request.headers.get(CSRF_HEADER)
    ):
        await refuse(
            request,
            f"key:{opened.id}:{opened.name}",
            f"missing or wrong {CSRF_HEADER} header: a console session must send its CSRF "
            "token with every request that changes anything",
        )
    return opened


async def refuse(request: Request, actor: str, detail: str) -> NoReturn:
    """Record a refused call in the audit log (``auth.forbidden``), then raise 403 with
    ``detail``. The refusal stands even if the audit write fails (logged)."""
    try:
        async with request.app.state.sessions() as session, session.begin():
            await audit.record(
                session,
                actor=actor,
                action="auth.forbidden",
                target_type="route",
                target_id=f"{request.method} {request.url.path}"[:200],
                before=None,
                after={"detail": detail},
            )
    except Exception:  # the database is away: the caller still gets its 403
        logger.exception("could not audit a refused call by %s", actor)
    raise ForbiddenError(detail)
