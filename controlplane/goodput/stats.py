"""What the engine answers: window statistics, minute rollups and its own health counts.

All values are plain data (frozen dataclasses) so the REST API, the SSE stream and the
Prometheus collector can serialise them without touching engine state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = [
    "COMPLIANCE",
    "STANDARD_WINDOWS",
    "EngineHealth",
    "GoodputStats",
    "LatencyHistogram",
    "LatencyPercentiles",
    "MinuteRollup",
    "SLOTotals",
]

#: Named windows every SLO answers, in seconds; ``"compliance"`` is the SLO's own window.
STANDARD_WINDOWS: Mapping[str, float] = {
    "10s": 10.0,
    "1m": 60.0,
    "5m": 300.0,
    "1h": 3600.0,
    "1d": 86400.0,
}
COMPLIANCE = "compliance"


@dataclass(frozen=True, slots=True)
class LatencyPercentiles:
    """p50/p90/p99 of one latency metric in seconds, within the sketch's relative error
    (1 %); ``None`` when the window holds no value of the metric."""

    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None


@dataclass(frozen=True, slots=True)
class GoodputStats:
    """One SLO over one window ending at ``time`` (wall-clock seconds).

    Counts (requests finishing in the window, by finish time):

    * ``requests``: judged requests (final, status OK or ERROR); ``good`` of them met every
      objective and succeeded; ``bad = requests − good``; ``errors``: status ERROR (bad);
    * ``aborted``: cancelled by the client (admitted, not judged); ``admitted = requests +
      aborted``; ``rejected``: shed by admission control (counts against availability);
    * ``output_tokens``: tokens of admitted requests; ``good_output_tokens``: of good ones;
    * ``violations``: objective key → judged requests that broke that objective;
    * ``measured``: objective key → judged requests whose record carried the objective's
      metric (docs/metrics.md: an ITL objective on a ``SUMMARY`` record is unmeasured, and
      such a request is judged on its other objectives); ``measured_ratio`` = measured /
      requests (``None`` when nothing was judged), to read beside the attainment.

    Rates divide by ``duration_s`` = the window, or the time since history began (engine
    start, earliest loaded rollup or earliest finish accepted) when that is shorter, at
    least 1 s. ``goodput_rps`` = good/s; ``throughput_rps`` = admitted requests finished/s.

    Ratios: ``attainment_ratio`` = good/requests (``None`` when nothing was judged);
    ``burn_rate`` = (1 − attainment)/(1 − target) (``None`` likewise);
    ``error_budget_remaining_ratio`` = 1 − (bad/requests)/(1 − target) over the SLO's
    *compliance* window whatever ``window_s`` is (1.0 when nothing was judged; negative
    once the budget is overspent); ``availability_ratio`` = admitted/(admitted + rejected)
    (``None`` when both are 0). Percentiles come from the window's latency sketches of
    successful requests (ITL: every gap). ``in_flight``: requests with a partial update and
    no final record yet (live, whatever the window).
    """

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
    violations: Mapping[str, int]
    ttft: LatencyPercentiles
    tpot: LatencyPercentiles
    itl: LatencyPercentiles
    e2el: LatencyPercentiles
    in_flight: int = 0
    measured: Mapping[str, int] = dataclasses.field(default_factory=dict)
    measured_ratio: Mapping[str, float | None] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (nested dataclasses become dicts)."""
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class MinuteRollup:
    """Everything the engine knows about one SLO over one complete UTC minute.

    Absolute, not a delta: re-emitting a minute (after a late record, or on request)
    carries its full counts, so the store upserts by ``(slo_id, minute_start)``. Counts as
    in :class:`GoodputStats`; ``unmeasured``: objective key → judged requests on which it
    was not measured (absent keys are 0); ``sketch_blob`` is an opaque, versioned encoding of the
    minute's latency sketches (decode with :func:`controlplane.goodput.rollup_sketches`).
    ``rejected_by_class``: priority class → rejections of the minute (the classes with any;
    empty for an SLO that rejected nothing); ``other_sketch_blob``: the sketches of the OK
    requests the selector matches at the other vantage, in the same encoding (``b""`` when
    there were none); ``vantage``: the SLO's vantage when the minute was emitted (``"gateway"``
    or ``"engine"``; ``""``: unknown, read as the SLO's current one), which says which of the
    two blobs is whose after a vantage change.
    """

    slo_id: str
    minute_start: datetime
    requests: int
    good: int
    errors: int
    aborted: int
    rejected: int
    output_tokens: int
    good_output_tokens: int
    violations: dict[str, int]
    sketch_blob: bytes
    unmeasured: dict[str, int] = dataclasses.field(default_factory=dict)
    rejected_by_class: dict[str, int] = dataclasses.field(default_factory=dict)
    other_sketch_blob: bytes = b""
    vantage: str = ""


@dataclass(frozen=True, slots=True)
class EngineHealth:
    """What the engine did with the records it was given (cumulative since start).

    ``records``: rows ingested; ``final``: final rows among them; ``in_flight_updates``:
    partial rows (never judged); ``late``: final rows older than the 1-second ring (1 h),
    kept in the coarse buckets only; ``dropped_late``: older than the late horizon, not
    counted anywhere; ``dropped_future``: finishing further ahead of the engine clock than
    it tolerates (clock skew), not counted anywhere; ``recent_rows`` / ``recent_evicted``:
    the dry-run store's size and the rows it evicted to stay within its cap;
    ``rollups_without_sketches``: minutes emitted with counts only because rollups were
    not collected within 2 h of them.
    """

    records: int
    final: int
    in_flight_updates: int
    late: int
    dropped_late: int
    dropped_future: int
    recent_rows: int
    recent_evicted: int
    rollups_without_sketches: int = 0


@dataclass(frozen=True, slots=True)
class LatencyHistogram:
    """Exact counts of one latency metric in ``exporters.buckets.LATENCY_BUCKETS_S``
    buckets (not cumulative; the last is ``+Inf``) and the sum of the values, seconds."""

    bucket_counts: tuple[int, ...]
    sum_s: float

    @property
    def count(self) -> int:
        return sum(self.bucket_counts)


@dataclass(frozen=True, slots=True)
class SLOTotals:
    """One SLO's lifetime totals since engine start, as Prometheus counters want them.

    ``good`` + ``bad`` = judged requests; ``violations`` and ``measured`` (judged requests
    on which the objective was measured) by objective key (keys of earlier versions of the
    SLO included); ``histograms`` by metric name (``"ttft"``, ``"tpot"``,
    ``"itl"`` over every gap, ``"e2el"``) of successful requests; ``in_flight`` as in
    :class:`GoodputStats`.
    """

    slo_id: str
    slo_name: str
    good: int
    bad: int
    rejected: int
    aborted: int
    violations: Mapping[str, int]
    histograms: Mapping[str, LatencyHistogram]
    in_flight: int
    measured: Mapping[str, int] = dataclasses.field(default_factory=dict)
