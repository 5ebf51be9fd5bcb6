"""API keys: minting, authenticating, listing and revoking.

A key is ``gp_`` + ``secrets.token_urlsafe(32)`` (256 random bits). Only its SHA-256 is
stored. A fast unsalted hash is enough here, unlike for passwords: salts and slow hashes
(bcrypt, argon2) defend low-entropy secrets against guessing, while a 256-bit random key
cannot be guessed even at billions of hashes per second, and a fast hash keeps the check
per request cheap. The first ``PREFIX_LENGTH`` characters are kept in clear as ``prefix``:
shown in lists, and used to find the candidate row, whose hash is then compared in constant
time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import uuid
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.errors import InvalidInputError, NotFoundError
from controlplane.models import APIKey, Role
from controlplane.services import audit

__all__ = [
    "KEY_PREFIX",
    "PREFIX_LENGTH",
    "TENANT_ROLES",
    "authenticate",
    "create_key",
    "generate_key",
    "get_key",
    "hash_key",
    "key_public",
    "list_keys",
    "revoke_key",
]

logger = logging.getLogger(__name__)

KEY_PREFIX = "gp_"
PREFIX_LENGTH = 11  # "gp_" + 8 random characters: 48 bits, enough to find the row
_KEY_LENGTH = len(KEY_PREFIX) + 43  # token_urlsafe(32) is 43 characters
# Roles whose keys may be scoped to one tenant; admin and agent keys act fleet-wide.
TENANT_ROLES = frozenset({Role.VIEWER, Role.OPERATOR, Role.INGEST})


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_public(key: APIKey) -> dict[str, Any]:
    """The JSON-ready public form of a key (what lists and the audit log show; no hash)."""
    return {
        "id": str(key.id),
        "name": key.name,
        "prefix": key.prefix,
        "role": key.role.value,
        "tenant": key.tenant,
        "created_at": key.created_at.isoformat(),
        "last_used_at": key.last_used_at.isoformat() if key.last_used_at else None,
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


async def create_key(
    session: AsyncSession,
    *,
    name: str,
    role: Role,
    tenant: str | None,
    actor: str,
    now: datetime,
) -> tuple[APIKey, str]:
    """Mint a key; returns the row and the key itself, which is never retrievable again."""
    if tenant is not None and role not in TENANT_ROLES:
        allowed = ", ".join(sorted(r.value for r in TENANT_ROLES))
        raise InvalidInputError(
            f"tenant is only allowed for roles {allowed}; role {role.value!r} acts on every "
            f"tenant, got tenant {tenant!r}",
            loc=("body", "tenant"),
        )
    secret = generate_key()
    key = APIKey(
        name=name,
        prefix=secret[:PREFIX_LENGTH],
        hash=hash_key(secret),
        role=role,
        tenant=tenant,
        created_at=now,
    )
    session.add(key)
    await session.flush()
    await audit.record(
        session,
        actor=actor,
        action="key.create",
        target_type="api_key",
        target_id=str(key.id),
        before=None,
        after=key_public(key),
        now=now,
    )
    return key, secret


async def authenticate(
    session: AsyncSession, presented: str, *, now: datetime, touch_after_s: float
) -> APIKey | None:
    """The live key matching ``presented``, or ``None``.

    ``last_used_at`` is written only when older than ``touch_after_s`` (so a busy key costs
    one small UPDATE a minute, not one per request) and best-effort: a busy database must
    not turn a valid request into an error.
    """
    if len(presented) != _KEY_LENGTH or not presented.startswith(KEY_PREFIX):
        return None
    digest = hash_key(presented)
    candidates = await session.scalars(
        sa.select(APIKey).where(
            APIKey.prefix == presented[:PREFIX_LENGTH], APIKey.revoked_at.is_(None)
        )
    )
    match = next((k for k in candidates if hmac.compare_digest(k.hash, digest)), None)
    if match is None:
        return None
    stale_before = now - timedelta(seconds=touch_after_s)
    if match.last_used_at is None or match.last_used_at <= stale_before:
        try:
            await session.execute(
                sa.update(APIKey)
                .where(
                    APIKey.id == match.id,
                    sa.or_(APIKey.last_used_at.is_(None), APIKey.last_used_at <= stale_before),
                )
                .values(last_used_at=now)
            )
            await session.commit()
            match.last_used_at = now
        except OperationalError:
            logger.debug("last_used_at of key %s not updated (database busy)", match.id)
            await session.rollback()
    return match


async def get_key(session: AsyncSession, key_id: uuid.UUID) -> APIKey:
    key = await session.get(APIKey, key_id)
    if key is None:
        raise NotFoundError(f"API key {key_id} not found")
    return key


async def list_keys(
    session: AsyncSession,
    *,
    include_revoked: bool,
    role: Role | None,
    limit: int,
    offset: int,
) -> tuple[list[APIKey], int]:
    """One page of keys, newest first, and the number matching."""
    conditions: list[sa.ColumnElement[bool]] = []
    if not include_revoked:
        conditions.append(APIKey.revoked_at.is_(None))
    if role is not None:
        conditions.append(APIKey.role == role)
    count = await session.scalar(sa.select(sa.func.count()).select_from(APIKey).where(*conditions))
    rows = await session.scalars(
        sa.select(APIKey)
        .where(*conditions)
        .order_by(APIKey.created_at.desc(), APIKey.id)
        .limit(limit)
        .offset(offset)
    )
    return list(rows), int(count or 0)


async def revoke_key(
    session: AsyncSession, key_id: uuid.UUID, *, actor: str, now: datetime
) -> APIKey:
    """Revoke a key (idempotent: revoking a revoked key changes nothing and audits nothing)."""
    key = await get_key(session, key_id)
    if key.revoked_at is not None:
        return key
    before = key_public(key)
    key.revoked_at = now
    await session.flush()
    await audit.record(
        session,
        actor=actor,
        action="key.revoke",
        target_type="api_key",
        target_id=str(key.id),
        before=before,
        after=key_public(key),
        now=now,
    )
    return key
