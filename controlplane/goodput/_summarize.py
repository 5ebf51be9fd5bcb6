"""Counter columns, and turning summed counters and sketches into :class:`GoodputStats`.

Both the live windows and the dry run sum the same columns; this module is where the
ratios of docs/metrics.md are computed, once.
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
    "remap_columns",
    "width",
]

I64 = npt.NDArray[np.int64]

# Counter columns. With K objectives, objective k's violations are column
# BASE_COLUMNS + k and the judged requests on which it was *not* measured column
# BASE_COLUMNS + K + k (unmeasured rather than measured, so that a minute stored before the
# column existed reads as fully measured, which is how it was judged): see width().
REQUESTS, GOOD, ERRORS, ABORTED, REJECTED, OUTPUT_TOKENS, GOOD_OUTPUT_TOKENS = range(7)
BASE_COLUMNS = 7


def width(num_objectives: int) -> int:
    """Counter columns of an SLO with ``num_objectives`` objectives."""
    return BASE_COLUMNS + 2 * num_objectives


def remap_columns(old_keys: Sequence[str], new_keys: Sequence[str]) -> list[int | None]:
    """For each counter column of ``new_keys``, the column of ``old_keys`` it continues
    (``None``: a new objective, starting at 0)."""
    columns: list[int | None] = list(range(BASE_COLUMNS))
    for block in (0, 1):
        columns += [
            BASE_COLUMNS + block * len(old_keys) + old_keys.index(k) if k in old_keys else None
            for k in new_keys
        ]
    return columns


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
    """Stats of ``spec`` from summed ``counts`` (columns above, violations then unmeasured
    counts in ``keys`` order), the compliance window's ``compliance_counts`` and ``(len(METRICS),
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
        measured={key: requests - c[BASE_COLUMNS + len(keys) + k] for k, key in enumerate(keys)},
        measured_ratio={
            key: _ratio(requests - c[BASE_COLUMNS + len(keys) + k], requests)
            for k, key in enumerate(keys)
        },
        ttft=per_metric["ttft"],
        tpot=per_metric["tpot"],
        itl=per_metric["itl"],
        e2el=per_metric["e2el"],
        in_flight=in_flight,
    )
