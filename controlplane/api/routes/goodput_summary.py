"""The overview's data: one compact row per SLO, sorted by burn (role ``viewer``).

* ``GET /api/v1/goodput/summary?model=&tenant=&vantage=`` — :class:`GoodputSummaryPublic`:
  per SLO only what the console's overview draws (goodput and throughput over 5 min,
  attainment, availability, burn rates over 5 min, 30 min, 1 h and 6 h, error budget left,
  a status and a 15-minute goodput sparkline), most burning first;
* ``GET /api/v1/goodput/summary/stream`` (same filters) — Server-Sent Events: a first
  ``event: summary`` with every row (or, given ``since`` or ``Last-Event-ID``, only the
  rows changed since that summary), then one per ``goodput_stream_interval_s`` with only
  the rows that changed (``order`` is sent when the order changed).

The rows, their ``status`` (the SRE workbook's multiwindow burn-rate alerts) and their
sharing are :mod:`controlplane.runtime.summary`'s: every request and stream shares one
computation of all rows per ``goodput_stream_interval_s`` (1 s): the rows are at most two
intervals old on the first read, one on the stream, and ``time`` says when they were
computed.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import Response, StreamingResponse

from controlplane.api.deps import SettingsDep, SummaryDep, Viewer
from controlplane.api.routes._params import FilterText
from controlplane.models import SLOVantage
from controlplane.runtime.summary import SharedSummary, SummaryFilter
from controlplane.schemas.goodput import GoodputSummaryPublic

__all__ = ["router", "summary_filter"]

router = APIRouter(tags=["goodput"])

VantageFilter = Annotated[SLOVantage | None, Query(description="gateway or engine")]


def summary_filter(
    principal: Viewer,
    model: FilterText | None = None,
    tenant: FilterText | None = None,
    vantage: VantageFilter = None,
) -> SummaryFilter:
    """The caller's filter (role ``viewer``; a tenant key sees only its tenant)."""
    chosen = None if vantage is None else vantage.value
    return SummaryFilter(model, tenant, chosen, principal.tenant)


SummaryFilterDep = Annotated[SummaryFilter, Depends(summary_filter)]


@router.get("/goodput/summary", response_model=GoodputSummaryPublic)
async def goodput_summary(
    where: SummaryFilterDep, summary: SummaryDep, settings: SettingsDep
) -> Response:
    """Every visible SLO's overview row, most burning first (see the module). Rows up to
    two stream intervals old are served as they are: a page's stream (``since=time``) then
    brings them up to date with its first event."""
    interval_s = settings.goodput_stream_interval_s
    now, rows = await summary.rows(where, max_age_s=2 * interval_s)
    data = ",".join(e for _, e in rows)  # each row encoded once per computation
    body = f'{{"time":{json.dumps(now)},"data":[{data}],"count":{len(rows)}}}'
    return Response(body, media_type="application/json")


def _as_time(value: str | None) -> float | None:
    try:
        parsed = float(value) if value else None
    except ValueError:
        return None
    return parsed if parsed is not None and math.isfinite(parsed) else None


def _event(now: float, changed: list[str], full: bool, order: list[str] | None) -> str:
    ordered = "" if order is None else f',"order":{json.dumps(order, separators=(",", ":"))}'
    rows = ",".join(changed)  # each row encoded once per computation
    data = f'{{"time":{json.dumps(now)},"rows":[{rows}],"full":{json.dumps(full)}{ordered}}}'
    return f"id: {now!r}\nevent: summary\ndata: {data}\n\n"


async def _summary_events(
    shared: SharedSummary, where: SummaryFilter, interval_s: float, since: float | None
) -> AsyncIterator[str]:
    yield f"retry: {int(interval_s * 3000)}\n\n"
    known = None if since is None else shared.at(since, where)
    sent = {r.slo_id: e for r, e in known or []}
    order = list(sent)
    full = known is None
    while not shared.live.stopping.is_set():
        now, rows = await shared.rows(where, max_age_s=interval_s / 2)
        encoded = {r.slo_id: e for r, e in rows}
        changed = [e for slo_id, e in encoded.items() if sent.get(slo_id) != e]
        new_order = list(encoded)
        yield _event(now, changed, full, new_order if full or new_order != order else None)
        sent, order, full = encoded, new_order, False
        try:
            await asyncio.wait_for(shared.live.stopping.wait(), timeout=interval_s)
        except TimeoutError:
            continue


@router.get(
    "/goodput/summary/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "SSE stream"}},
)
async def goodput_summary_stream(
    where: SummaryFilterDep,
    summary: SummaryDep,
    settings: SettingsDep,
    since: Annotated[float | None, Query(description="time of rows already held")] = None,
    last_event_id: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> StreamingResponse:
    """``event: summary`` (``id``: its ``time``): ``{"time", "full", "rows": [changed
    rows], "order"?: [ids]}``. ``since`` (the ``time`` of a summary the client holds) or a
    reconnecting browser's ``Last-Event-ID`` starts the stream with only what changed since
    then, while those rows are still kept (a few seconds); otherwise every row, ``full``."""
    interval_s = settings.goodput_stream_interval_s
    resume = _as_time(last_event_id)
    return StreamingResponse(
        _summary_events(summary, where, interval_s, resume or since),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
