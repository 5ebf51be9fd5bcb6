"""Bearer API-key authentication and role checks: one dependency factory, ``require(role)``.

Every route declares the role it needs by depending on ``require(...)`` (directly or through
the aliases in ``controlplane.api.deps``). ``route_requirements(route)`` reads that declaration
back, so the app refuses to start with an unguarded route and a test can check every route
against every role, including routes other modules add later.

Who satisfies what (``grants``): ``admin`` satisfies every role; ``operator`` satisfies
``viewer``; ``viewer``, ``ingest`` and ``agent`` satisfy only themselves.

A caller without a bearer key may present the console's sign-in cookie instead: it stands
for the key it was opened with, and a mutation must also carry the session's CSRF token
(``controlplane.api.sessions``). A refused role check is a 403 recorded in the audit log
(``auth.forbidden``).

Keys are checked through the database's :class:`~controlplane.services.keys.KeyCache`
(5-s TTL): a revocation through this process applies at once, one made elsewhere within
the TTL (see ``controlplane.services.keys``).

Example::

    @router.post("/slos", status_code=201)
    async def create_slo(principal: Operator, session: SessionDep, body: SLOCreate) -> SLOPublic:
        ...
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from controlplane.api.sessions import OpenSession, console_session, refuse
from controlplane.db import utcnow
from controlplane.errors import UnauthenticatedError
from controlplane.models import KeyRole
from controlplane.services import keys as key_service
from controlplane.services.keys import AuthenticatedKey
from controlplane.settings import Settings

__all__ = [
    "ANONYMOUS",
    "PRINCIPAL_SCOPE_KEY",
    "OpenSetting",
    "Principal",
    "RoleRequirement",
    "assert_routes_guarded",
    "bearer_credentials",
    "document_open_routes",
    "grants",
    "require",
    "route_requirements",
]

OpenSetting = Literal["open_health", "open_metrics"]

# Which held roles satisfy a needed role (admin satisfies everything).
_SATISFIED_BY: dict[KeyRole, frozenset[KeyRole]] = {
    KeyRole.VIEWER: frozenset({KeyRole.VIEWER, KeyRole.OPERATOR, KeyRole.ADMIN}),
    KeyRole.OPERATOR: frozenset({KeyRole.OPERATOR, KeyRole.ADMIN}),
    KeyRole.ADMIN: frozenset({KeyRole.ADMIN}),
    KeyRole.INGEST: frozenset({KeyRole.INGEST, KeyRole.ADMIN}),
    KeyRole.AGENT: frozenset({KeyRole.AGENT, KeyRole.ADMIN}),
}

_bearer = HTTPBearer(auto_error=False, description="An API key: `Authorization: Bearer gp_...`")


def grants(held: KeyRole, needed: KeyRole) -> bool:
    """Whether a key with role ``held`` may call a route that needs ``needed``."""
    return held in _SATISFIED_BY[needed]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: an API key (``key_id`` set), the CLI, or nobody on an open route.

    ``tenant`` is the key's tenant scope (``None``: all tenants). ``actor`` is the string the
    audit log records.
    """

    key_id: uuid.UUID | None
    name: str
    role: KeyRole | None
    tenant: str | None = None

    @property
    def actor(self) -> str:
        return f"key:{self.key_id}:{self.name}" if self.key_id is not None else self.name


ANONYMOUS = Principal(key_id=None, name="anonymous", role=None)
CLI = Principal(key_id=None, name="cli", role=KeyRole.ADMIN)


class RoleRequirement:
    """A FastAPI dependency that admits a caller whose key grants ``role``.

    With ``open_setting`` (``"open_health"`` / ``"open_metrics"``) the route is open when that
    setting is true, and needs ``role`` otherwise.
    """

    def __init__(self, role: KeyRole, open_setting: OpenSetting | None = None) -> None:
        self.role = role
        self.open_setting = open_setting

    def __repr__(self) -> str:
        return f"require({self.role.value!r}, open_setting={self.open_setting!r})"

    def is_open(self, settings: Settings) -> bool:
        return self.open_setting is not None and bool(getattr(settings, self.open_setting))

    async def __call__(
        self,
        request: Request,
        credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),  # noqa: B008
    ) -> Principal:
        settings: Settings = request.app.state.settings
        if self.is_open(settings):
            return ANONYMOUS
        # Authenticated before the body was read (controlplane.api.limits): not twice.
        early: Principal | None = request.scope.get(PRINCIPAL_SCOPE_KEY)
        if early is not None and early.role is not None and grants(early.role, self.role):
            return early
        key: AuthenticatedKey | OpenSession | None
        if credentials is None or not credentials.credentials:
            # The console's sign-in cookie stands for the key it was opened with.
            key = await console_session(request)
        else:
            # The key cache of this app's database: a busy caller is not a query per request.
            key = await key_service.authenticate_cached(
                request.app.state.sessions,
                key_service.key_cache(request.app.state.engine, ttl_s=settings.key_cache_ttl_s),
                credentials.credentials,
                now=utcnow(),
                touch_after_s=settings.key_last_used_resolution_s,
            )
            if key is None:
                raise UnauthenticatedError("invalid API key: unknown or revoked")
        principal = Principal(key_id=key.id, name=key.name, role=key.role, tenant=key.tenant)
        if not grants(key.role, self.role):
            allowed = sorted(r.value for r in _SATISFIED_BY[self.role])
            await refuse(
                request,
                principal.actor,
                f"this route needs role {self.role.value!r} (allowed: {', '.join(allowed)}); "
                f"key {key.name!r} has role {key.role.value!r}",
            )
        return principal


#: Where :mod:`controlplane.api.limits` keeps the principal it authenticated early.
PRINCIPAL_SCOPE_KEY = "goodput.principal"


async def bearer_credentials(request: Request) -> HTTPAuthorizationCredentials | None:
    """The request's bearer credentials, as the routes' dependency reads them."""
    return await _bearer(request)


def require(role: KeyRole, *, open_setting: OpenSetting | None = None) -> RoleRequirement:
    """The dependency for a route that needs ``role`` (see :class:`RoleRequirement`)."""
    return RoleRequirement(role, open_setting)


def _walk(dependant: Dependant) -> Iterator[RoleRequirement]:
    for sub in dependant.dependencies:
        if isinstance(sub.call, RoleRequirement):
            yield sub.call
        yield from _walk(sub)


def route_requirements(route: APIRoute) -> list[RoleRequirement]:
    """The role requirements a route declares (empty: the route is unguarded)."""
    return list(_walk(route.dependant))


def document_open_routes(app: FastAPI, schema: dict[str, Any]) -> dict[str, Any]:
    """Drop the bearer requirement from the OpenAPI operations that are open under the app's
    settings (``/health`` with ``open_health``), so the schema tells clients the truth."""
    settings: Settings = app.state.settings
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        if any(req.is_open(settings) for req in route_requirements(route)):
            for method in route.methods:
                operation = schema.get("paths", {}).get(route.path_format, {}).get(method.lower())
                if operation is not None:
                    operation.pop("security", None)
    return schema


def assert_routes_guarded(app: FastAPI) -> None:
    """Raise if any API route declares no role: a forgotten guard fails at startup, not in prod."""
    unguarded = [
        f"{','.join(sorted(route.methods))} {route.path}"
        for route in app.routes
        if isinstance(route, APIRoute) and not route_requirements(route)
    ]
    if unguarded:
        raise RuntimeError(
            f"routes without a role requirement: {', '.join(unguarded)}; "
            "add a dependency on controlplane.api.auth.require(KeyRole...)"
        )
