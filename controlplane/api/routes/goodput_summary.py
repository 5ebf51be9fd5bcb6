"""The overview's data: one compact row per SLO, sorted by burn (role ``viewer``).

* ``GET /api/v1/goodput/summary?model=&tenant=&vantage=`` — :class:`GoodputSummaryPublic`:
  per SLO only what the console's overview draws (goodput and throughput over 5 min,
  attainment, availability, burn rates over 5 min, 30 min, 1 h and 6 h, error budget left,
  a status and a 15-minute goodput sparkline), most burning first;
* ``GET /api/v1/goodput/summary/stream`` (same filters) — Server-Sent Events: a first
  ``event: summary`` with every row, then one per ``goodput_stream_interval_s`` with only
  the rows that changed (``order`` is sent when the order changed).

``status`` follows the multiwindow burn-rate alerts of the SRE workbook: ``critical`` when
the 1 h and 5 min burn rates are both at least 14.4 (2 % of a 30-day budget in an hour) or
the budget is spent; ``warning`` when the 6 h and 30 min burn rates are both at least 6;
``no_data`` when nothing was judged in 6 h; ``ok`` otherwise. The server decides it, so
every client shows the same.

Cheap by construction: no latency sketch is read (counts only), completed sparkline
minutes are computed once and kept, and every request and stream shares one computation
of all rows per ``goodput_stream_interval_s`` (1 s): the rows are at most that old, as on
the stream, and ``time`` says when they were computed.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from controlplane.api.deps import LiveDep, Viewer
from controlplane.api.routes._params import FilterText
from controlplane.goodput import GoodputEngine, GoodputStats
from controlplane.live import LiveGoodput
from controlplane.models import SLOVantage

__all__ = [
    "BURN_WINDOWS",
    "SPARK_MINUTES",
    "GoodputSummaryPublic",
    "SummaryFilter",
    "SummaryRow",
    "compute_summary",
    "router",
]

router = APIRouter(tags=["goodput"])

#: Burn-rate windows of each row, in seconds.
BURN_WINDOWS: dict[str, float] = {"5m": 300.0, "30m": 1800.0, "1h": 3600.0, "6h": 21600.0}
FAST_BURN, SLOW_BURN = 14.4, 6.0
#: Complete minutes in the sparkline (goodput, good requests per second, oldest first).
SPARK_MINUTES = 15
_STATUS_RANK = {"critical": 0, "warning": 1, "ok": 2, "no_data": 3}


class SummaryRow(BaseModel):
    """One SLO as the overview shows it (rates and ratios over 5 min unless named)."""

    slo_id: str
    slo_name: str
    model: str | None
    tenant: str | None
    vantage: str
    target: float
    goodput_rps: float
    throughput_rps: float
    attainment_ratio: float | None
    availability_ratio: float | None
    burn_rate_5m: float | None
    burn_rate_30m: float | None
    burn_rate_1h: float | None
    burn_rate_6h: float | None
    error_budget_remaining_ratio: float
    status: str
    spark: list[float]


class GoodputSummaryPublic(BaseModel):
    time: float
    data: list[SummaryRow]
    count: int


@dataclass(frozen=True, slots=True)
class SummaryFilter:
    """Exact matches on the SLO's selector labels and vantage; ``scope`` is the key's tenant."""

    model: str | None = None
    tenant: str | None = None
    vantage: str | None = None
    scope: str | None = None

    def admits(self, row: SummaryRow) -> bool:
        return (
            (self.scope is None or row.tenant == self.scope)
            and (self.model is None or row.model == self.model)
            and (self.tenant is None or row.tenant == self.tenant)
            and (self.vantage is None or row.vantage == self.vantage)
        )


@dataclass
class _Sparklines:
    """Goodput per complete minute, by minute then SLO id: a minute is computed once."""

    minutes: dict[int, dict[str, float]] = field(default_factory=dict)

    def series(self, engine: GoodputEngine, now: float, ids: list[str]) -> dict[str, list[float]]:
        current = math.floor(now) // 60
        wanted = range(current - SPARK_MINUTES, current)
        for minute in wanted:
            known = self.minutes.get(minute)
            if known is None or any(i not in known for i in ids):
                end = minute * 60 + 59.5
                stats = engine.summary(end, 60.0, percentiles=False)
                self.minutes[minute] = {s.slo_id: s.goodput_rps for s in stats}
        for minute in [m for m in self.minutes if m < wanted.start]:
            del self.minutes[minute]
        return {i: [_round(self.minutes[m].get(i, 0.0)) for m in wanted] for i in ids}


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def _ratio(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _status(burn: dict[str, float | None], budget: float, judged_6h: int) -> str:
    if judged_6h == 0:
        return "no_data"

    def over(window: str, threshold: float) -> bool:
        value = burn[window]
        return value is not None and value >= threshold

    if budget <= 0 or (over("1h", FAST_BURN) and over("5m", FAST_BURN)):
        return "critical"
    if over("6h", SLOW_BURN) and over("30m", SLOW_BURN):
        return "warning"
    return "ok"


def _sort_key(row: SummaryRow) -> tuple[int, float, str]:
    burn = row.burn_rate_1h if row.burn_rate_1h is not None else -1.0
    return (_STATUS_RANK[row.status], -burn, row.slo_name)


def compute_summary(engine: GoodputEngine, now: float, sparklines: _Sparklines) -> list[SummaryRow]:
    """Every SLO's row, most burning first (run it on a worker thread)."""
    specs = {s.id: s for s in engine.slos}
    by_window: dict[str, dict[str, GoodputStats]] = {
        name: {s.slo_id: s for s in engine.summary(now, window_s, percentiles=False)}
        for name, window_s in BURN_WINDOWS.items()
    }
    spark = sparklines.series(engine, now, list(specs))
    rows = []
    for slo_id, spec in specs.items():
        stats = {name: by_window[name].get(slo_id) for name in BURN_WINDOWS}
        short = stats["5m"]
        if short is None or any(s is None for s in stats.values()):
            continue  # the SLO set changed between the reads: next time
        burn = {name: _ratio(s.burn_rate) for name, s in stats.items() if s is not None}
        judged_6h = stats["6h"].requests if stats["6h"] is not None else 0
        rows.append(
            SummaryRow(
                slo_id=slo_id,
                slo_name=spec.name,
                model=spec.selector.get("model"),
                tenant=spec.selector.get("tenant"),
                vantage=spec.vantage.name.lower(),
                target=spec.target,
                goodput_rps=_round(short.goodput_rps),
                throughput_rps=_round(short.throughput_rps),
                attainment_ratio=_ratio(short.attainment_ratio),
                availability_ratio=_ratio(short.availability_ratio),
                burn_rate_5m=burn["5m"],
                burn_rate_30m=burn["30m"],
                burn_rate_1h=burn["1h"],
                burn_rate_6h=burn["6h"],
                error_budget_remaining_ratio=round(short.error_budget_remaining_ratio, 6),
                status=_status(burn, short.error_budget_remaining_ratio, judged_6h),
                spark=spark[slo_id],
            )
        )
    rows.sort(key=_sort_key)
    return rows


class _SharedSummary:
    """The rows of every SLO, computed at most once per ``max_age_s`` however many requests
    and streams read them (each then keeps the rows its filter admits)."""

    def __init__(self, live: LiveGoodput) -> None:
        self.live = live
        self.sparklines = _Sparklines()
        self._latest: tuple[float, float, list[SummaryRow]] | None = None
        self._lock = asyncio.Lock()

    async def rows(self, where: SummaryFilter, max_age_s: float) -> tuple[float, list[SummaryRow]]:
        async with self._lock:
            latest = self._latest
            if latest is None or time.monotonic() - latest[0] >= max_age_s:
                now = self.live.clock()
                rows = await run_in_threadpool(
                    compute_summary, self.live.engine, now, self.sparklines
                )
                latest = self._latest = (time.monotonic(), now, rows)
        return latest[1], [r for r in latest[2] if where.admits(r)]


def _shared(request: Request, live: LiveGoodput) -> _SharedSummary:
    shared: _SharedSummary | None = getattr(request.app.state, "goodput_summary", None)
    if shared is None or shared.live is not live:
        shared = request.app.state.goodput_summary = _SharedSummary(live)
    return shared


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


@router.get("/goodput/summary")
async def goodput_summary(
    where: SummaryFilterDep, live: LiveDep, request: Request
) -> GoodputSummaryPublic:
    """Every visible SLO's overview row, most burning first (see the module)."""
    interval_s: float = request.app.state.settings.goodput_stream_interval_s
    now, rows = await _shared(request, live).rows(where, max_age_s=interval_s)
    return GoodputSummaryPublic(time=now, data=rows, count=len(rows))


async def _summary_events(
    shared: _SharedSummary, where: SummaryFilter, interval_s: float
) -> AsyncIterator[str]:
    yield f"retry: {int(interval_s * 3000)}\n\n"
    sent: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    while not shared.live.stopping.is_set():
        now, rows = await shared.rows(where, max_age_s=interval_s / 2)
        dumped = {r.slo_id: r.model_dump(mode="json") for r in rows}
        changed = [row for slo_id, row in dumped.items() if sent.get(slo_id) != row]
        new_order = list(dumped)
        payload: dict[str, Any] = {"time": now, "rows": changed, "full": not sent}
        if new_order != order:
            payload["order"] = new_order
        sent, order = dumped, new_order
        yield f"event: summary\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"
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
    where: SummaryFilterDep, live: LiveDep, request: Request
) -> StreamingResponse:
    """``event: summary``: ``{"time", "full", "rows": [changed rows], "order"?: [ids]}``."""
    interval_s: float = request.app.state.settings.goodput_stream_interval_s
    return StreamingResponse(
        _summary_events(_shared(request, live), where, interval_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
