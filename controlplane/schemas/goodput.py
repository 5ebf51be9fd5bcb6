"""Wire models of the goodput routes: an SLO's stats (``/slos/{ref}/goodput``,
``/goodput``), the dry run of a candidate SLO, the overview's rows (``/goodput/summary``)
and the per-minute series (``/slos/{ref}/goodput/series``)."""

from __future__ import annotations

from pydantic import BaseModel

__all__ = [
    "GoodputSummaryPublic",
    "SummaryRow",
]


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
