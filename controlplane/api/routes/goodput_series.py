"""One SLO's goodput over time, for charts (role ``viewer``).

``GET /api/v1/slos/{id_or_name}/goodput/series?range=1h`` answers columns of equal length
(:class:`GoodputSeriesPublic`): ``time`` (Unix seconds, the end of each step) and, per step
of ``step_s`` = range / points, goodput and throughput (requests/s), attainment,
availability, rejected requests, the TTFT/TPOT/ITL/E2EL p50 and p99 of the step; per point,
the burn rate over 5 min, 1 h and 6 h ending there and the error budget left over the
compliance window ending there. ``range`` is one of ``10s``, ``1m``, ``5m``, ``1h``,
``1d``, ``compliance``. The engine answers each point from its rings (``controlplane.goodput``):
counts exact, percentiles within 1 %; ``null`` where a step judged nothing.

Beside ``columns``, of the same length as ``time``: ``rejected_by_class``, per priority
class (the records' ``priority`` label; ``""`` for requests without one; at most 8
classes, later ones as ``"other"``) the rejections of each step, which sum to
``columns.rejected`` except for minutes stored before the rollups kept classes; and
``percentiles_by_vantage``, per vantage (``gateway``, ``engine``) the columns
``{ttft,tpot,itl,e2el}_{p50,p99}_s`` of the OK requests the SLO's selector matches there:
at the SLO's own vantage those of the requests it judges (the ``columns`` above), at the
other those the engine keeps beside them (not judged; both restored from the rollups).
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from controlplane.api.deps import LiveDep, SessionDep, Viewer
from controlplane.api.routes._params import Ref
from controlplane.api.routes.goodput import _BAD_WINDOW, WindowQuery, _window
from controlplane.goodput import GoodputEngine, GoodputStats
from controlplane.schemas.common import responses
from controlplane.schemas.goodput import GoodputSeriesPublic
from controlplane.services import slos as slo_service

__all__ = ["router", "series"]

router = APIRouter(tags=["goodput"])

MAX_POINTS = 60
BURN_WINDOWS_S = {"5m": 300.0, "1h": 3600.0, "6h": 21600.0}
LATENCIES = ("ttft", "tpot", "itl", "e2el")


def _range_s(engine: GoodputEngine, slo_id: str, name: str) -> float:
    stats = engine.query(slo_id, name, percentiles=False)
    return stats.window_s


def series(engine: GoodputEngine, slo_id: str, range_s: float, now: float) -> dict[str, Any]:
    """The columns (see the module) of ``slo_id`` over the ``range_s`` ending at ``now``."""
    points = int(min(MAX_POINTS, max(range_s, 1)))
    step_s = float(max(1, math.ceil(range_s / points)))
    end = math.floor(now)
    times = [end - step_s * (points - 1 - k) for k in range(points)]
    columns: dict[str, list[float | None]] = {"time": [float(t) for t in times]}

    by_class: dict[str, list[float]] = {}
    by_vantage: dict[str, dict[str, list[float | None]]] = {}

    def put(name: str, value: float | None) -> None:
        columns.setdefault(name, []).append(value)

    for k, t in enumerate(times):
        step: GoodputStats = engine.query(slo_id, step_s, t)
        put("goodput_rps", step.goodput_rps)
        put("throughput_rps", step.throughput_rps)
        put("attainment_ratio", step.attainment_ratio)
        put("availability_ratio", step.availability_ratio)
        put("rejected", float(step.rejected))
        put("error_budget_remaining_ratio", step.error_budget_remaining_ratio)
        for metric in LATENCIES:
            p = getattr(step, metric)
            put(f"{metric}_p50_s", p.p50_s)
            put(f"{metric}_p99_s", p.p99_s)
        for label, window_s in BURN_WINDOWS_S.items():
            burn = engine.query(slo_id, window_s, t, percentiles=False).burn_rate
            put(f"burn_rate_{label}", burn)
        for name, count in engine.rejected_by_class(slo_id, step_s, t).items():
            # A class first seen at a later step has 0 before it.
            by_class.setdefault(name, [0.0] * k).append(float(count))
        for vantage, metrics in engine.vantage_percentiles(slo_id, step_s, t).items():
            out = by_vantage.setdefault(vantage, {})
            for metric, p in metrics.items():
                out.setdefault(f"{metric}_p50_s", []).append(p.p50_s)
                out.setdefault(f"{metric}_p99_s", []).append(p.p99_s)
    return {
        "step_s": step_s,
        "columns": columns,
        "rejected_by_class": by_class,
        "percentiles_by_vantage": by_vantage,
    }


@router.get("/slos/{slo_ref}/goodput/series", responses={**_BAD_WINDOW, **responses(404)})
async def slo_goodput_series(
    principal: Viewer, session: SessionDep, live: LiveDep, slo_ref: Ref, range: WindowQuery = "1h"
) -> GoodputSeriesPublic:
    """Columns for the SLO detail page's charts (see the module)."""
    name = _window(range)
    slo = await slo_service.get_slo(session, slo_ref, tenant=principal.tenant)
    slo_id = str(slo.id)
    spec = live.spec(slo_id)
    if spec is None or spec.version != slo.version:
        await live.refresh_slos(force=True)
    range_s = await run_in_threadpool(_range_s, live.engine, slo_id, name)
    result = await run_in_threadpool(series, live.engine, slo_id, range_s, live.clock())
    return GoodputSeriesPublic(
        slo_id=slo_id,
        slo_name=slo.name,
        vantage=str(slo.vantage.value),
        target=slo.target,
        range_s=range_s,
        **result,
    )
