"""Dependency aliases for route signatures: the request's session, the caller's role, what
the app holds for the routes (settings, the live goodput runtime, the overview's shared
rows, the planner, the database engine, the metrics registry), and the app-wide query rule
(:func:`strict_query`). Routes read the app's state only through these.

``SessionDep`` is one transaction per request: committed when the handler returns, rolled
back when it raises. Its scope is ``"function"`` so the commit happens *before* the response
is sent; a failing commit is then an error response, never a 2xx for a lost write.
``LiveDep`` is the runtime once its SLO set is loaded (503 before); ``LiveRuntimeDep`` is
the runtime as it is, for routes that answer before the load (health, a dry run) or report
it their own way (OTLP). Declare the role first: dependencies run in order, so an
unauthenticated caller gets its 401 before anything else.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import UnionType
from typing import Annotated, Union, get_args, get_origin

from fastapi import Depends, Request
from fastapi.dependencies.utils import get_flat_dependant
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from controlplane.api.auth import Principal, require
from controlplane.errors import ForbiddenError, InvalidInputError, UnavailableError
from controlplane.models import KeyRole
from controlplane.runtime.live import LiveGoodput
from controlplane.runtime.planner import PlannerRuntime
from controlplane.runtime.summary import SharedSummary
from controlplane.settings import Settings

__all__ = [
    "Admin",
    "Agent",
    "ClusterOperator",
    "DatabaseDep",
    "Ingest",
    "LiveDep",
    "LiveRuntimeDep",
    "Operator",
    "PlannerDep",
    "RegistryDep",
    "SessionDep",
    "SettingsDep",
    "SummaryDep",
    "Viewer",
    "get_database",
    "get_live",
    "get_planner",
    "get_registry",
    "get_session",
    "get_settings",
    "get_summary",
    "loaded_live",
    "strict_query",
]


def _is_sequence(annotation: object) -> bool:
    origin = get_origin(annotation)
    if origin in (list, tuple, set, frozenset, Sequence):
        return True
    if origin in (Union, UnionType, Annotated):
        return any(_is_sequence(arg) for arg in get_args(annotation))
    return False


def _query_params(route: object) -> tuple[frozenset[str], frozenset[str]]:
    """The query parameters the route declares (its dependencies' too), and those of them
    that take several values (``?x=a&x=b``)."""
    dependant = getattr(route, "dependant", None)
    params = get_flat_dependant(dependant).query_params if dependant is not None else []
    names = frozenset(field.alias for field in params)
    multi = frozenset(f.alias for f in params if _is_sequence(f.field_info.annotation))
    return names, multi


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:37] + "...")


async def strict_query(request: Request) -> None:
    """Refuse what the route's query schema does not allow, rather than guess: a parameter
    the route does not declare (FastAPI would ignore it, so ``?limt=5`` would silently list
    50) and a parameter given several times where the route takes one value (FastAPI would
    keep the last: ``?model=a&model=b``). Both are a 422 naming the parameter."""
    route = request.scope.get("route")
    if route is None or not request.query_params:  # most calls: nothing to check
        return
    names, multi = _query_params(route)
    for key in dict.fromkeys(request.query_params.keys()):
        values = request.query_params.getlist(key)
        if key not in names:
            allowed = ", ".join(sorted(names)) or "none"
            raise InvalidInputError(
                f"{key!r} is not a query parameter of this route (allowed: {allowed}), "
                f"got {_shown(values[0])}",
                loc=("query", key),
            )
        if len(values) > 1 and key not in multi:
            raise InvalidInputError(
                f"{key} must be given once, got {len(values)} values", loc=("query", key)
            )


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as session, session.begin():
        yield session


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_database(request: Request) -> AsyncEngine:
    """The app's database engine (``/ready`` checks the connection and the schema)."""
    engine: AsyncEngine = request.app.state.engine
    return engine


async def get_registry(request: Request) -> CollectorRegistry:
    """The app's metrics registry (never the process-global one)."""
    registry: CollectorRegistry = request.app.state.metrics_registry
    return registry


async def get_planner(request: Request) -> PlannerRuntime | None:
    """The PD planner's runtime, ``None`` when the planner is disabled or not started."""
    planner: PlannerRuntime | None = getattr(request.app.state, "planner", None)
    return planner


async def get_live(request: Request) -> LiveGoodput:
    """The live goodput runtime, loaded or not (:func:`loaded_live` waits for the load)."""
    live: LiveGoodput = request.app.state.live
    return live


LiveRuntimeDep = Annotated[LiveGoodput, Depends(get_live)]


async def loaded_live(live: LiveRuntimeDep) -> LiveGoodput:
    """The live goodput runtime once it has loaded the SLO set (it tries now if it has not):
    until then a 503 naming the reason, with ``Retry-After``, so exporters keep their
    batches and resend them rather than have them counted against no SLO."""
    if not await live.ensure_loaded():
        raise UnavailableError(
            f"the goodput engine has not loaded the SLO set yet ({live.load_error}); retry later",
            retry_after_s=1,
        )
    return live


LiveDep = Annotated[LiveGoodput, Depends(loaded_live)]


async def get_summary(request: Request, live: LiveDep) -> SharedSummary:
    """The overview's rows, shared by every request and stream of the app (one per live
    runtime: a new one when the app's lifespan starts a new runtime)."""
    shared: SharedSummary | None = getattr(request.app.state, "goodput_summary", None)
    if shared is None or shared.live is not live:
        shared = request.app.state.goodput_summary = SharedSummary(live)
    return shared


SessionDep = Annotated[AsyncSession, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]
DatabaseDep = Annotated[AsyncEngine, Depends(get_database)]
RegistryDep = Annotated[CollectorRegistry, Depends(get_registry)]
PlannerDep = Annotated[PlannerRuntime | None, Depends(get_planner)]
SummaryDep = Annotated[SharedSummary, Depends(get_summary)]


def _cluster_wide(role: KeyRole) -> Callable[[Principal], Awaitable[Principal]]:
    """``require(role)``, for a key acting on every tenant: the planner's switch (pause,
    resume) and a tick now act on the whole fleet, so a tenant-scoped key gets 403. (Fleet
    members, commands, pins and moves take the key's tenant instead: the routes pass
    ``principal.tenant`` to the services, docs/api.md.)"""

    async def cluster_wide(principal: Principal) -> Principal:
        if principal.tenant is not None:
            raise ForbiddenError(
                "this route acts on the whole cluster (the planner's pause, resume and tick); "
                f"key {principal.name!r} is scoped to tenant {principal.tenant!r}"
            )
        return principal

    # The role requirement as a sub-dependency, set on the signature (a closure variable
    # cannot appear in a postponed annotation).
    parameter = inspect.Parameter(
        "principal",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=Depends(require(role)),
        annotation=Principal,
    )
    cluster_wide.__signature__ = inspect.Signature([parameter], return_annotation=Principal)  # type: ignore[attr-defined]
    return cluster_wide


Viewer = Annotated[Principal, Depends(require(KeyRole.VIEWER))]
Operator = Annotated[Principal, Depends(require(KeyRole.OPERATOR))]
Admin = Annotated[Principal, Depends(require(KeyRole.ADMIN))]
Ingest = Annotated[Principal, Depends(require(KeyRole.INGEST))]
Agent = Annotated[Principal, Depends(require(KeyRole.AGENT))]
ClusterOperator = Annotated[Principal, Depends(_cluster_wide(KeyRole.OPERATOR))]
