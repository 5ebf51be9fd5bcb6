"""Goodput queries, SLO dry runs and the live SSE stream (role ``viewer``).

* ``GET /api/v1/slos/{id_or_name}/goodput?window=5m`` — one SLO's :class:`GoodputStatsPublic`;
* ``GET /api/v1/goodput?window=1m`` — every SLO the key may see;
* ``POST /api/v1/slos:dry-run`` — a candidate SLO (an ``SLOCreate`` body) judged over the
  last ``window_s`` (at most 1 h) of stored requests, without saving anything, with the
  objectives it cannot measure at its vantage in ``warnings``. A read, so ``viewer`` may
  run it;
* ``GET /api/v1/goodput/stream`` — Server-Sent Events: one ``event: goodput`` per
  ``goodput_stream_interval_s`` (1 s) with every SLO's stats over 10 s, 1 min and 5 min;
  it ends when the client goes away or the app shuts down.

``window`` is one of ``10s``, ``1m`` (default), ``5m``, ``1h``, ``1d``, ``compliance`` (the
SLO's own window); anything else is a 400 naming them. A key scoped to a tenant sees only
SLOs whose selector has that tenant, and may dry-run only such SLOs. The numbers are the
engine's (``controlplane.goodput``): attainment and counts exact, percentiles within the
sketch's 1 %. Queries and the stream answer 503 until the engine has loaded the SLO set (after
a start without a database, ``controlplane.runtime.live``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from controlplane.api.deps import DatabaseDep, LiveDep, LiveRuntimeDep, SettingsDep, Viewer
from controlplane.api.routes._params import Ref
from controlplane.errors import (
    BadRequestError,
    ForbiddenError,
    InvalidInputError,
    NotFoundError,
)
from controlplane.goodput import (
    COMPLIANCE,
    STANDARD_WINDOWS,
    GoodputEngine,
    GoodputStats,
    SpecError,
    UnknownSLOError,
)
from controlplane.goodput.spec import measurement_warnings
from controlplane.models import SLO
from controlplane.runtime.live import LiveGoodput
from controlplane.schemas.common import ErrorPublic, responses
from controlplane.schemas.goodput import (
    GoodputsPublic,
    GoodputStatsPublic,
    SLODryRun,
    SLODryRunPublic,
)
from controlplane.services import slos as slo_service

__all__ = ["INLINE_WINDOWS", "STREAM_WINDOWS", "WINDOWS", "WindowQuery", "router"]

router = APIRouter(tags=["goodput"])

WINDOWS: tuple[str, ...] = (*STANDARD_WINDOWS, COMPLIANCE)
STREAM_WINDOWS: tuple[str, ...] = ("10s", "1m", "5m")
#: Windows a goodput query answers on the event loop when the engine is free: the short
#: ones the stream serves, whose query takes 0.5-1 ms (docs/scale-out.md, "Queries").
INLINE_WINDOWS: frozenset[str] = frozenset(STREAM_WINDOWS)
_BAD_WINDOW: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorPublic, "description": "Unknown window name"}
}
# A plain string checked by _window (a 400 naming the windows); the schema lists them.
WindowQuery = Annotated[
    str,
    Query(
        max_length=20,
        description=f"one of {list(WINDOWS)} (default 1m)",
        json_schema_extra={"enum": list(WINDOWS)},
    ),
]


def _public(stats: GoodputStats) -> GoodputStatsPublic:
    return GoodputStatsPublic.model_validate(stats)


def _window(window: str) -> str:
    if window not in WINDOWS:
        raise BadRequestError(f"window must be one of {list(WINDOWS)}, got {window!r}")
    return window


def _visible(selector: Mapping[str, str], tenant: str | None) -> bool:
    return tenant is None or selector.get("tenant") == tenant


@router.get("/slos/{slo_ref}/goodput", responses={**_BAD_WINDOW, **responses(404)})
async def slo_goodput(
    principal: Viewer,
    live: LiveDep,
    slo_ref: Ref,
    *,
    database: DatabaseDep,
    settings: SettingsDep,
    window: WindowQuery = "1m",
) -> GoodputStatsPublic:
    """The SLO's goodput, attainment, error budget, burn rate and latency percentiles."""
    name = _window(window)
    # Which SLO the reference means, from the SLO cache (no session on a hit: an SLO
    # changed through another replica is seen within slo_cache_ttl_s).
    ttl_s, tenant = settings.slo_cache_ttl_s, principal.tenant
    slo = await slo_service.resolve_slo(database, slo_ref, tenant=tenant, ttl_s=ttl_s)
    spec = live.spec(str(slo.id))
    if spec is None or spec.version != slo.version:
        # The engine or the cache is behind: the database decides, and the engine
        # reloads if it is the one behind (read-your-writes for a just-changed SLO).
        slo = await slo_service.resolve_slo(
            database, slo_ref, tenant=tenant, ttl_s=ttl_s, fresh=True
        )
        spec = live.spec(str(slo.id))
        if spec is None or spec.version != slo.version:
            await live.refresh_slos(force=True)
    slo_id = str(slo.id)
    try:
        # A window of at most 5 minutes is under a millisecond of the engine's
        # time: answered on the event loop when the engine is free (no thread's wake-up
        # on the answer's path), in a worker thread when a batch is being counted.
        stats = live.engine.query_if_free(slo_id, name) if name in INLINE_WINDOWS else None
        if stats is None:
            stats = await run_in_threadpool(live.engine.query, slo_id, name)
    except UnknownSLOError:  # deleted between the read and the query
        raise NotFoundError(f"SLO with id {slo_id!r} not found") from None
    return _public(stats)


@router.get("/goodput", responses=_BAD_WINDOW)
async def all_goodput(
    principal: Viewer, live: LiveDep, window: WindowQuery = "1m"
) -> GoodputsPublic:
    """Every SLO's stats over ``window``, in the engine's order (by name)."""
    name = _window(window)
    visible = {s.id for s in live.engine.slos if _visible(s.selector, principal.tenant)}
    stats = await run_in_threadpool(live.engine.summary, None, name)
    data = [_public(s) for s in stats if s.slo_id in visible]
    return GoodputsPublic(data=data, count=len(data))


@router.post("/slos:dry-run", responses=responses(403))
async def dry_run(principal: Viewer, live: LiveRuntimeDep, body: SLODryRun) -> SLODryRunPublic:
    """What the candidate SLO would have measured over the last ``window_s`` seconds."""
    candidate = body.slo
    selector = candidate.selector.model_dump(exclude_none=True)
    if not _visible(selector, principal.tenant):
        raise ForbiddenError(
            f"this key is scoped to tenant {principal.tenant!r}: slo.selector.tenant must be "
            f"{principal.tenant!r}, got {selector.get('tenant')!r}"
        )
    # A transient row (never added to a session) so the one registry → spec mapping is used.
    row = SLO(
        id=uuid.uuid4(),
        name=candidate.name,
        selector=selector,
        objectives=[o.model_dump() for o in candidate.objectives],
        target=candidate.target,
        window_s=candidate.window_s,
        vantage=candidate.vantage,
        availability_target=candidate.availability_target,
        infeasible=candidate.infeasible,
        version=1,
    )
    try:
        spec = slo_service.to_spec(row)
        stats = await run_in_threadpool(live.engine.dry_run, spec, body.window_s)
    except SpecError as exc:
        raise InvalidInputError(str(exc), loc=("body", "slo")) from None
    return SLODryRunPublic(
        **dict(_public(stats)), warnings=measurement_warnings(spec.vantage, spec.objectives)
    )


def _snapshot(engine: GoodputEngine, now: float, tenant: str | None) -> dict[str, Any]:
    """Every visible SLO's stats over the stream windows, JSON-ready (worker thread)."""
    visible = {s.id for s in engine.slos if _visible(s.selector, tenant)}
    slos: dict[str, dict[str, Any]] = {}
    for window in STREAM_WINDOWS:
        for stats in engine.summary(now, window):
            if stats.slo_id not in visible:
                continue
            entry = slos.setdefault(
                stats.slo_id, {"slo_id": stats.slo_id, "slo_name": stats.slo_name, "windows": {}}
            )
            entry["windows"][window] = _public(stats).model_dump(mode="json")
    return {"time": now, "slos": list(slos.values())}


async def _events(live: LiveGoodput, tenant: str | None, interval_s: float) -> AsyncIterator[str]:
    yield f"retry: {int(interval_s * 3000)}\n\n"
    while not live.stopping.is_set():
        payload = await run_in_threadpool(_snapshot, live.engine, live.clock(), tenant)
        yield f"event: goodput\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"
        try:
            await asyncio.wait_for(live.stopping.wait(), timeout=interval_s)
        except TimeoutError:
            continue


@router.get(
    "/goodput/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "SSE stream"}},
)
async def goodput_stream(
    principal: Viewer, live: LiveDep, settings: SettingsDep
) -> StreamingResponse:
    """``event: goodput`` once a second: ``{"time", "slos": [{"slo_id", "slo_name",
    "windows": {"10s": stats, "1m": stats, "5m": stats}}]}``."""
    interval_s = settings.goodput_stream_interval_s
    return StreamingResponse(
        _events(live, principal.tenant, interval_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
