"""The overview's rows (``GET /api/v1/goodput/summary`` and its stream), computed from the
live engine at most once per interval however many requests and streams read them.

One compact row per SLO, sorted by burn (:class:`~controlplane.schemas.goodput.SummaryRow`):
goodput and throughput over 5 min, attainment, availability, burn rates over 5 min, 30 min,
1 h and 6 h, error budget left, a status and a 15-minute goodput sparkline.

``status`` follows the multiwindow burn-rate alerts of the SRE workbook: ``critical`` when
the 1 h and 5 min burn rates are both at least 14.4 (2 % of a 30-day budget in an hour) or
the budget is spent; ``warning`` when the 6 h and 30 min burn rates are both at least 6;
``no_data`` when nothing was judged in 6 h; ``ok`` otherwise. The server decides it, so
every client shows the same.

Cheap by construction: no latency sketch is read (counts only), the four windows are one
pass over the engine's counters, the sparklines one read of its per-minute counters, and
:class:`SharedSummary` (one per live runtime, ``controlplane.api.deps.SummaryDep``) computes
all rows once per ``max_age_s`` for every reader.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from controlplane.goodput import GoodputEngine, GoodputStats, SLOSpec
from controlplane.runtime.live import LiveGoodput
from controlplane.schemas.goodput import SummaryRow

__all__ = [
    "BURN_WINDOWS",
    "KEPT_COMPUTATIONS",
    "SPARK_MINUTES",
    "SharedSummary",
    "SummaryFilter",
    "build_rows",
    "compute_summary",
    "sparklines",
]

#: Burn-rate windows of each row, in seconds.
BURN_WINDOWS: dict[str, float] = {"5m": 300.0, "30m": 1800.0, "1h": 3600.0, "6h": 21600.0}
FAST_BURN, SLOW_BURN = 14.4, 6.0
#: Complete minutes in the sparkline (goodput, good requests per second, oldest first).
SPARK_MINUTES = 15
#: Computations kept for streams that start from rows a client holds (one per second).
KEPT_COMPUTATIONS = 5
_STATUS_RANK = {"critical": 0, "warning": 1, "ok": 2, "no_data": 3}


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


def sparklines(engine: GoodputEngine, now: float) -> dict[str, list[float]]:
    """Every SLO's goodput (good requests per second) in each of the last
    ``SPARK_MINUTES`` complete minutes, oldest first, from the engine's minute counters."""
    current = math.floor(now) // 60
    good = engine.good_per_minute(current - SPARK_MINUTES, current - 1)
    return {slo_id: [_round(n / 60.0) for n in counts] for slo_id, counts in good.items()}


def build_rows(
    specs: Iterable[SLOSpec],
    by_window: Mapping[str, Mapping[str, GoodputStats]],
    spark: Mapping[str, list[float]],
) -> list[SummaryRow]:
    """The rows of ``specs`` from their stats per window of ``BURN_WINDOWS`` (by SLO id)
    and sparklines, most burning first; an SLO missing from a window is left out (the SLO
    set changed between the reads: it comes back next time)."""
    rows = []
    for spec in specs:
        stats = {name: by_window[name].get(spec.id) for name in BURN_WINDOWS}
        short, long = stats["5m"], stats["6h"]
        if short is None or long is None or any(s is None for s in stats.values()):
            continue
        burn = {name: _ratio(s.burn_rate) for name, s in stats.items() if s is not None}
        rows.append(
            SummaryRow(
                slo_id=spec.id,
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
                status=_status(burn, short.error_budget_remaining_ratio, long.requests),
                spark=spark.get(spec.id, [0.0] * SPARK_MINUTES),
            )
        )
    rows.sort(key=_sort_key)
    return rows


def compute_summary(engine: GoodputEngine, now: float) -> list[SummaryRow]:
    """Every SLO's row, most burning first (run it on a worker thread): one pass over the
    engine's counters for the four windows, one read of its minute counters."""
    windows = engine.summaries(BURN_WINDOWS, now)
    by_window = {name: {s.slo_id: s for s in stats} for name, stats in windows.items()}
    return build_rows(engine.slos, by_window, sparklines(engine, now))


#: A computation's time and the rows a filter admits, each with its JSON.
_Rows = tuple[float, list[tuple[SummaryRow, str]]]


@dataclass(frozen=True, slots=True)
class _Computed:
    """One computation: when (monotonic and engine time), the rows, each row's JSON."""

    at_ts: float
    time: float
    rows: list[SummaryRow]
    encoded: list[str]

    def admitted(self, where: SummaryFilter) -> list[tuple[SummaryRow, str]]:
        return [(r, e) for r, e in zip(self.rows, self.encoded, strict=True) if where.admits(r)]


def _compute(engine: GoodputEngine, now: float) -> _Computed:
    rows = compute_summary(engine, now)
    return _Computed(time.monotonic(), now, rows, [r.model_dump_json() for r in rows])


class SharedSummary:
    """The rows of every SLO, computed (and encoded as JSON) at most once per ``max_age_s``
    however many requests and streams read them; each keeps the rows its filter admits. The
    last ``KEPT_COMPUTATIONS`` are kept by time, so that a stream can start from the rows a
    client already has (:meth:`at`)."""

    def __init__(self, live: LiveGoodput) -> None:
        self.live = live
        self._recent: deque[_Computed] = deque(maxlen=KEPT_COMPUTATIONS)
        self._lock = asyncio.Lock()

    def _fresh(self, max_age_s: float) -> _Computed | None:
        latest = self._recent[-1] if self._recent else None
        if latest is None or time.monotonic() - latest.at_ts >= max_age_s:
            return None
        return latest

    async def rows(self, where: SummaryFilter, max_age_s: float) -> _Rows:
        # A fresh enough computation is served at once, even while another one runs.
        latest = self._fresh(max_age_s)
        if latest is None:
            async with self._lock:
                latest = self._fresh(max_age_s)
                if latest is None:
                    now = self.live.clock()
                    latest = await run_in_threadpool(_compute, self.live.engine, now)
                    self._recent.append(latest)
        return latest.time, latest.admitted(where)

    def at(self, computed_time: float, where: SummaryFilter) -> list[tuple[SummaryRow, str]] | None:
        """The rows ``where`` admits of the computation at ``computed_time`` (the ``time``
        of an answer or the ``id`` of an event), or ``None`` when it is no longer kept."""
        for computed in self._recent:
            if computed.time == computed_time:
                return computed.admitted(where)
        return None
