"""API keys: minting, authenticating, listing and revoking.

A key is ``gp_`` + ``secrets.token_urlsafe(32)`` (256 random bits). Only its SHA-256 is
stored. A fast unsalted hash is enough here, unlike for passwords: salts and slow hashes
(bcrypt, argon2) defend low-entropy secrets against guessing, while a 256-bit random key
cannot be guessed even at billions of hashes per second, and a fast hash keeps the check
per request cheap. The first ``PREFIX_LENGTH`` characters are kept in clear as ``prefix``:
shown in lists, and used to find the candidate row, whose hash is then compared in constant
time (``hmac.compare_digest``).

Authenticating goes through a :class:`KeyCache` (one per database, see :func:`key_cache`)
so that a busy ingest path does not query the database per request: a key found in the
database is remembered for ``KEY_CACHE_TTL_S`` (5 s), looked up by prefix and compared in
constant time exactly like a row. **Revocation** in this process (:func:`revoke_key`) takes
effect at once; a key revoked by another process (another replica, the CLI) stops working
within the TTL. ``last_used_at`` is still written at most once per ``touch_after_s``.
A key used past half its entry's life is read again in the background while the cached
entry answers (:meth:`KeyCache.claim_refresh`): a busy caller does not wait for the
database when its entry expires, and the bound above is unchanged (an entry is never
served past the TTL of the read that made it).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from controlplane.errors import InvalidInputError, NotFoundError
from controlplane.models import APIKey, KeyRole
from controlplane.services import audit
from controlplane.services.ttl_cache import BoundedTTLCache, engine_of

__all__ = [
    "KEY_CACHE_MAX_ENTRIES",
    "KEY_CACHE_TTL_S",
    "KEY_PREFIX",
    "PREFIX_LENGTH",
    "TENANT_ROLES",
    "AuthenticatedKey",
    "KeyCache",
    "authenticate",
    "authenticate_cached",
    "create_key",
    "generate_key",
    "get_key",
    "hash_key",
    "key_cache",
    "key_public",
    "list_keys",
    "revoke_key",
]

logger = logging.getLogger(__name__)

KEY_PREFIX = "gp_"
PREFIX_LENGTH = 11  # "gp_" + 8 random characters: 48 bits, enough to find the row
_KEY_LENGTH = len(KEY_PREFIX) + 43  # token_urlsafe(32) is 43 characters
# Roles whose keys may be scoped to one tenant; admin and agent keys act fleet-wide.
TENANT_ROLES = frozenset({KeyRole.VIEWER, KeyRole.OPERATOR, KeyRole.INGEST})
#: How long an authenticated key is trusted without asking the database again: the longest
#: a key revoked by another process keeps working here.
KEY_CACHE_TTL_S = 5.0
#: Key prefixes remembered per database (least recently used evicted first).
KEY_CACHE_MAX_ENTRIES = 10_000
# Revoked key ids remembered so that a lookup racing the revocation cannot re-cache them.
_REVOKED_REMEMBERED = 10_000


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
    role: KeyRole,
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


@dataclass(frozen=True, slots=True)
class AuthenticatedKey:
    """The facts about a live key that a request needs (a plain value, safe to share
    between requests, unlike an ORM row). ``hash`` is kept for constant-time comparison."""

    id: uuid.UUID
    name: str
    role: KeyRole
    tenant: str | None
    prefix: str
    hash: str
    last_used_at: datetime | None

    @classmethod
    def of(cls, k: APIKey) -> AuthenticatedKey:
        return cls(k.id, k.name, k.role, k.tenant, k.prefix, k.hash, k.last_used_at)


class KeyCache(BoundedTTLCache):
    """Keys recently authenticated against one database, by prefix (see the module).

    ``get`` finds the prefix's cached keys and compares the presented key's SHA-256 with
    each in constant time, as the database path does; an entry older than ``ttl_s`` is
    dropped, never served. ``invalidate(key_id)`` (called by :func:`revoke_key`) drops the
    key and refuses to cache it again, so a lookup that read the row before the revocation
    committed cannot bring it back. At most ``max_entries`` prefixes are kept, least
    recently used evicted first. Thread-safe. ``clock`` (monotonic seconds) and ``ttl_s``
    are plain attributes, so a test can drive time.

    Example::

        cache = KeyCache(ttl_s=5.0)
        key = cache.get(presented)              # None: ask the database, then cache.put(...)
    """

    def __init__(
        self,
        ttl_s: float = KEY_CACHE_TTL_S,
        max_entries: int = KEY_CACHE_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(ttl_s, max_entries, clock)
        # prefix -> (expiry, keys with that prefix); usually one key per prefix.
        self._entries: OrderedDict[str, tuple[float, tuple[AuthenticatedKey, ...]]] = OrderedDict()
        self._revoked: dict[uuid.UUID, None] = {}  # an ordered set, oldest first
        self._refreshing: set[str] = set()  # prefixes being read again in the background

    def get(self, presented: str) -> AuthenticatedKey | None:
        """The cached live key matching ``presented``, or ``None`` (unknown here: ask the
        database)."""
        if not _well_formed(presented):
            return None
        prefix = presented[:PREFIX_LENGTH]
        with self._lock:
            entry = self._entries.get(prefix)
            if entry is None:
                return None
            if entry[0] <= self.clock():
                del self._entries[prefix]
                return None
            self._entries.move_to_end(prefix)
        digest = hash_key(presented)
        return next((k for k in entry[1] if hmac.compare_digest(k.hash, digest)), None)

    def known(self, presented: str) -> bool:
        """Whether the database's answer for ``presented``'s prefix is cached and fresh
        (then :meth:`get` is the whole answer: ``None`` means no such live key)."""
        if not _well_formed(presented):
            return True
        with self._lock:
            entry = self._entries.get(presented[:PREFIX_LENGTH])
            return entry is not None and entry[0] > self.clock()

    def claim_refresh(self, presented: str) -> bool:
        """Whether the caller should read ``presented``'s prefix again now: its entry is
        past half its life and no other read of it is in flight (the claim lasts until
        :meth:`put` or :meth:`release` for that prefix)."""
        prefix = presented[:PREFIX_LENGTH]
        with self._lock:
            entry = self._entries.get(prefix)
            if entry is None or prefix in self._refreshing:
                return False
            if entry[0] - self.clock() > self.ttl_s / 2:
                return False
            self._refreshing.add(prefix)
            return True

    def release(self, prefix: str) -> None:
        """End a claim without an answer (the read failed)."""
        with self._lock:
            self._refreshing.discard(prefix)

    def put(self, keys: tuple[AuthenticatedKey, ...], prefix: str | None = None) -> None:
        """Remember the live keys of one prefix (what the database returned for it);
        revoked ids are left out. With no keys, ``prefix`` is remembered as unknown for
        the TTL (negative caching: a stream of made-up keys costs no query each)."""
        if keys:
            prefix = keys[0].prefix
        if prefix is None:
            return
        with self._lock:
            self._refreshing.discard(prefix)
            live = tuple(k for k in keys if k.id not in self._revoked)
            if keys and not live:
                self._entries.pop(prefix, None)
                return
            self._entries[prefix] = (self.clock() + self.ttl_s, live)
            self._entries.move_to_end(prefix)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def invalidate(self, key_id: uuid.UUID) -> None:
        """Forget ``key_id`` now and never cache it again (it was revoked)."""
        with self._lock:
            for prefix, (expiry, keys) in list(self._entries.items()):
                rest = tuple(k for k in keys if k.id != key_id)
                if not rest:
                    del self._entries[prefix]
                elif len(rest) < len(keys):
                    self._entries[prefix] = (expiry, rest)
            self._revoked[key_id] = None
            if len(self._revoked) > _REVOKED_REMEMBERED:
                del self._revoked[next(iter(self._revoked))]

    def touched(self, key: AuthenticatedKey, when: datetime) -> AuthenticatedKey:
        """Record that ``key.last_used_at`` is now ``when`` (so the next requests do not
        write it again); returns the updated key."""
        updated = replace(key, last_used_at=when)
        with self._lock:
            entry = self._entries.get(key.prefix)
            if entry is not None:
                keys = tuple(updated if k.id == key.id else k for k in entry[1])
                self._entries[key.prefix] = (entry[0], keys)
        return updated


_caches: weakref.WeakKeyDictionary[Engine, KeyCache] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def key_cache(
    bind: AsyncEngine | AsyncConnection | Engine | Connection, *, ttl_s: float = KEY_CACHE_TTL_S
) -> KeyCache:
    """The key cache of the database behind ``bind`` (created on first use, with ``ttl_s``;
    gone with the engine). One per database engine, so that :func:`revoke_key` reaches the
    cache that authentication reads whatever session it is given."""
    engine = engine_of(bind)
    with _caches_lock:
        cache = _caches.get(engine)
        if cache is None:
            cache = _caches[engine] = KeyCache(ttl_s=ttl_s)
        return cache


async def authenticate_cached(
    sessions: async_sessionmaker[AsyncSession],
    cache: KeyCache,
    presented: str,
    *,
    now: datetime,
    touch_after_s: float,
) -> AuthenticatedKey | None:
    """The live key matching ``presented``, or ``None``: from ``cache`` when it holds the
    key, else from the database, whose live keys of that prefix are then cached. A session
    is opened only on a miss, or to write ``last_used_at`` (as :func:`authenticate`)."""
    key = cache.get(presented)
    if key is not None:
        if cache.claim_refresh(presented):  # past half its life: read again, not waited for
            task = asyncio.get_running_loop().create_task(_refresh(sessions, cache, presented))
            _refreshes.add(task)
            task.add_done_callback(_refreshes.discard)
        if _stale(key.last_used_at, now, touch_after_s):
            key = cache.touched(key, now)  # first: concurrent requests skip the write
            async with sessions() as session:
                await _touch(session, key.id, now, touch_after_s)
        return key
    if cache.known(presented):  # malformed, or the prefix's live keys are cached: no match
        return None
    async with sessions() as session:
        candidates = await _live_with_prefix(session, presented)
        cache.put(
            tuple(AuthenticatedKey.of(k) for k in candidates), prefix=presented[:PREFIX_LENGTH]
        )
        match = _matching(candidates, presented)
        if match is None:
            return None
        key = AuthenticatedKey.of(match)
        if _stale(key.last_used_at, now, touch_after_s):
            key = cache.touched(key, now)
            await _touch(session, key.id, now, touch_after_s)
        return key


_refreshes: set[asyncio.Task[None]] = set()  # background reads in flight (kept referenced)


async def _refresh(
    sessions: async_sessionmaker[AsyncSession], cache: KeyCache, presented: str
) -> None:
    """Read the live keys of ``presented``'s prefix again and cache them (a claimed
    refresh); a failure leaves the entry to expire on its own."""
    prefix = presented[:PREFIX_LENGTH]
    try:
        async with sessions() as session:
            candidates = await _live_with_prefix(session, presented)
    except Exception as exc:
        cache.release(prefix)
        logger.debug("background read of key prefix %s failed: %s", prefix, exc)
        return
    cache.put(tuple(AuthenticatedKey.of(k) for k in candidates), prefix=prefix)


async def authenticate(
    session: AsyncSession, presented: str, *, now: datetime, touch_after_s: float
) -> APIKey | None:
    """The live key matching ``presented``, or ``None``, from the database (no cache).

    ``last_used_at`` is written only when older than ``touch_after_s`` (so a busy key costs
    one small UPDATE a minute, not one per request) and best-effort: a busy database must
    not turn a valid request into an error.
    """
    if not _well_formed(presented):
        return None
    match = _matching(await _live_with_prefix(session, presented), presented)
    stale = match is not None and _stale(match.last_used_at, now, touch_after_s)
    if match is not None and stale and await _touch(session, match.id, now, touch_after_s):
        match.last_used_at = now
    return match


def _well_formed(presented: str) -> bool:
    return len(presented) == _KEY_LENGTH and presented.startswith(KEY_PREFIX)


async def _live_with_prefix(session: AsyncSession, presented: str) -> list[APIKey]:
    rows = await session.scalars(
        sa.select(APIKey).where(
            APIKey.prefix == presented[:PREFIX_LENGTH], APIKey.revoked_at.is_(None)
        )
    )
    return list(rows)


def _matching(candidates: list[APIKey], presented: str) -> APIKey | None:
    digest = hash_key(presented)
    return next((k for k in candidates if hmac.compare_digest(k.hash, digest)), None)


def _stale(last_used_at: datetime | None, now: datetime, touch_after_s: float) -> bool:
    return last_used_at is None or last_used_at <= now - timedelta(seconds=touch_after_s)


async def _touch(
    session: AsyncSession, key_id: uuid.UUID, now: datetime, touch_after_s: float
) -> bool:
    """Set ``last_used_at`` to ``now`` unless another writer made it fresh; best-effort
    (a busy database must not turn a valid request into an error). True when written."""
    stale_before = now - timedelta(seconds=touch_after_s)
    try:
        await session.execute(
            sa.update(APIKey)
            .where(
                APIKey.id == key_id,
                sa.or_(APIKey.last_used_at.is_(None), APIKey.last_used_at <= stale_before),
            )
            .values(last_used_at=now)
        )
        await session.commit()
    except OperationalError:
        logger.debug("last_used_at of key %s not updated (database busy)", key_id)
        await session.rollback()
        return False
    return True


async def get_key(session: AsyncSession, key_id: uuid.UUID) -> APIKey:
    key = await session.get(APIKey, key_id)
    if key is None:
        raise NotFoundError(f"API key {key_id} not found")
    return key


async def list_keys(
    session: AsyncSession,
    *,
    include_revoked: bool,
    role: KeyRole | None,
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
    """Revoke a key (idempotent: revoking a revoked key changes nothing and audits nothing).

    The key stops authenticating in this process at once (its cache entry is dropped, even
    before the caller commits); other processes notice within ``KEY_CACHE_TTL_S``.
    """
    key = await get_key(session, key_id)
    key_cache(session.get_bind()).invalidate(key.id)
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
