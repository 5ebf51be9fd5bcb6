"""Wire models of the goodput routes: an SLO's stats (``/slos/{ref}/goodput``,
``/goodput``), the dry run of a candidate SLO, the overview's rows (``/goodput/summary``)
and the per-minute series (``/slos/{ref}/goodput/series``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from controlplane.schemas.common import Interval, WireModel
from controlplane.schemas.slo import SLOCreate

__all__ = [
    "MAX_DRY_RUN_WINDOW_S",
    "GoodputSeriesPublic",
    "GoodputStatsPublic",
    "GoodputSummaryPublic",
    "GoodputsPublic",
    "LatencyPercentilesPublic",
    "SLODryRun",
    "SLODryRunPublic",
    "SummaryRow",
]

#: How far back a dry run may judge a candidate SLO (seconds).
MAX_DRY_RUN_WINDOW_S = 3600.0


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


class LatencyPercentilesPublic(BaseModel):
    """p50/p90/p99 in seconds (within 1 %); ``null`` when the window holds no value."""

    model_config = ConfigDict(from_attributes=True)

    p50_s: float | None
    p90_s: float | None
    p99_s: float | None


class GoodputStatsPublic(BaseModel):
    """One SLO over one window ending at ``time`` (Unix seconds); see
    ``controlplane.goodput.GoodputStats`` for each field's exact definition."""

    model_config = ConfigDict(from_attributes=True)

    slo_id: str
    slo_name: str
    window_s: float
    time: float
    duration_s: float
    requests: int
    good: int
    bad: int
    errors: int
    aborted: int
    admitted: int
    rejected: int
    output_tokens: int
    good_output_tokens: int
    goodput_rps: float
    good_output_tokens_per_s: float
    throughput_rps: float
    output_tokens_per_s: float
    attainment_ratio: float | None
    burn_rate: float | None
    error_budget_remaining_ratio: float
    availability_ratio: float | None
    violations: dict[str, int]
    measured: dict[str, int]
    measured_ratio: dict[str, float | None]
    ttft: LatencyPercentilesPublic
    tpot: LatencyPercentilesPublic
    itl: LatencyPercentilesPublic
    e2el: LatencyPercentilesPublic
    in_flight: int


class SLODryRunPublic(GoodputStatsPublic):
    """A dry run's stats, with ``warnings``: the objectives the candidate cannot measure at
    its vantage (as the create and update responses give them)."""

    warnings: list[str]


class GoodputsPublic(BaseModel):
    data: list[GoodputStatsPublic]
    count: int


class SLODryRun(WireModel):
    """A candidate SLO and how far back to judge it (seconds, at most one hour)."""

    slo: SLOCreate
    window_s: Annotated[float, Interval(0, MAX_DRY_RUN_WINDOW_S, low_open=True)] = Field(
        default=MAX_DRY_RUN_WINDOW_S
    )


class GoodputSeriesPublic(BaseModel):
    slo_id: str
    slo_name: str
    vantage: str
    target: float
    range_s: float
    step_s: float
    columns: dict[str, list[float | None]]
    rejected_by_class: dict[str, list[float]]
    percentiles_by_vantage: dict[str, dict[str, list[float | None]]]
