"""Counter columns, and turning summed counters and sketches into :class:`GoodputStats`.

Both the live windows and the dry run sum the same columns; this module is where the
ratios of DESIGN.md ("Metric definitions") are computed, once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from controlplane.goodput._batch import METRICS
from controlplane.goodput.spec import SLOSpec
from controlplane.goodput.stats import GoodputStats, LatencyPercentiles
from exporters.sketch import LatencySketch

__all__ = [
    "ABORTED",
    "BASE_COLUMNS",
    "ERRORS",
    "GOOD",
    "GOOD_OUTPUT_TOKENS",
    "OUTPUT_TOKENS",
    "REJECTED",
    "REQUESTS",
    "build_stats",
    "percentiles",
]

I64 = npt.NDArray[np.int64]

# Counter columns; objective k's violations are column BASE_COLUMNS + k.
REQUESTS, GOOD, ERRORS, ABORTED, REJECTED, OUTPUT_TOKENS, GOOD_OUTPUT_TOKENS = range(7)
BASE_COLUMNS = 7
_QUANTILES = (0.5, 0.9, 0.99)


def percentiles(counts: I64 | None) -> LatencyPercentiles:
    """p50/p90/p99 of a sketch counts array (``None`` fields when it is empty)."""
    if counts is None or not counts.any():
        return LatencyPercentiles()
    p50, p90, p99 = (LatencySketch.quantile_from_counts(counts, q) for q in _QUANTILES)
    return LatencyPercentiles(p50_s=p50, p90_s=p90, p99_s=p99)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def build_stats(
    spec: SLOSpec,
    keys: Sequence[str],
    *,
    window_s: float,
    time: float,
    duration_s: float,
    counts: I64,
    compliance_counts: I64,
    sketches: I64 | None,
    in_flight: int = 0,
) -> GoodputStats:
    """Stats of ``spec`` from summed ``counts`` (columns above, violations in ``keys``
    order), the compliance window's ``compliance_counts`` and ``(len(METRICS),
    NUM_BUCKETS)`` sketch ``sketches`` (``None``: no percentiles)."""
    c = [int(v) for v in counts.tolist()]
    requests, good, errors, aborted = c[REQUESTS], c[GOOD], c[ERRORS], c[ABORTED]
    rejected, admitted = c[REJECTED], requests + aborted
    budget = 1.0 - spec.target
    attainment = _ratio(good, requests)
    compliance_judged = int(compliance_counts[REQUESTS])
    compliance_bad = compliance_judged - int(compliance_counts[GOOD])
    if compliance_judged:
        budget_remaining = 1.0 - (compliance_bad / compliance_judged) / budget
    else:
        budget_remaining = 1.0
    duration = max(1.0, duration_s) if math.isfinite(duration_s) else window_s
    per_metric = (
        dict.fromkeys(METRICS, LatencyPercentiles())
        if sketches is None
        else {name: percentiles(sketches[m]) for m, name in enumerate(METRICS)}
    )
    return GoodputStats(
        slo_id=spec.id,
        slo_name=spec.name,
        window_s=window_s,
        time=time,
        duration_s=duration,
        requests=requests,
        good=good,
        bad=requests - good,
        errors=errors,
        aborted=aborted,
        admitted=admitted,
        rejected=rejected,
        output_tokens=c[OUTPUT_TOKENS],
        good_output_tokens=c[GOOD_OUTPUT_TOKENS],
        goodput_rps=good / duration,
        good_output_tokens_per_s=c[GOOD_OUTPUT_TOKENS] / duration,
        throughput_rps=admitted / duration,
        output_tokens_per_s=c[OUTPUT_TOKENS] / duration,
        attainment_ratio=attainment,
        burn_rate=None if attainment is None else (1.0 - attainment) / budget,
        error_budget_remaining_ratio=budget_remaining,
        availability_ratio=_ratio(admitted, admitted + rejected),
        violations={key: c[BASE_COLUMNS + k] for k, key in enumerate(keys)},
        ttft=per_metric["ttft"],
        tpot=per_metric["tpot"],
        itl=per_metric["itl"],
        e2el=per_metric["e2el"],
        in_flight=in_flight,
    )
