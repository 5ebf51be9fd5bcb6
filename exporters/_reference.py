"""Brute-force pure-Python reference of the metric core, for tests and the benchmark.

One request at a time, one token at a time, Python floats and lists only: written to be
obviously right, not fast. :mod:`exporters.latency`, :mod:`exporters.slo` and
:mod:`exporters.sketch` must agree with it (the property tests check they do, exactly),
and ``benchmarks/metric_core.py`` measures the vectorised code against it.

Records are assumed valid (``RecordBatch.validate`` is the gate for that).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from exporters.records import Phase, RequestRecord, Status, TokenDetail
from exporters.slo import Metric, Objective

__all__ = [
    "ReferenceLatencies",
    "reference_gaps_s",
    "reference_judge",
    "reference_latencies",
    "reference_measured",
    "reference_percentile",
    "reference_quantile_lower",
]

NAN = math.nan


@dataclass(frozen=True, slots=True)
class ReferenceLatencies:
    """One request's metrics (NaN where undefined), as :class:`RequestLatencies` rows."""

    ttft_s: float
    tpot_s: float
    e2el_s: float
    itl_max_s: float
    output_tokens: int
    num_gaps: int


def reference_gaps_s(record: RequestRecord) -> list[float]:
    """The request's ITL gaps in seconds: one per emission after the first, FULL only."""
    if record.token_detail != TokenDetail.FULL:
        return []
    times = [int(t) for t in record.emission_offsets_us]
    return [(times[i + 1] - times[i]) / 1e6 for i in range(len(times) - 1)]


def reference_latencies(record: RequestRecord) -> ReferenceLatencies:
    """TTFT, TPOT, E2EL, max ITL, output tokens and gap count of one request."""
    times = [int(t) for t in record.emission_offsets_us]
    if record.emission_tokens is None:
        counts = [1] * len(times)
    else:
        counts = [int(k) for k in record.emission_tokens]
    n = 0
    for k in counts:
        n += k
    if times:
        ttft = times[0] / 1e6
        e2el = times[-1] / 1e6
    else:
        ttft = NAN
        finished = int(record.phase_offsets_us[Phase.FINISHED])
        e2el = finished / 1e6 if finished >= 0 else NAN
    tpot = (times[-1] - times[0]) / ((n - 1) * 1e6) if times and n >= 2 else NAN
    gaps = reference_gaps_s(record)
    itl_max = NAN
    for gap in gaps:
        if math.isnan(itl_max) or gap > itl_max:
            itl_max = gap
    return ReferenceLatencies(ttft, tpot, e2el, itl_max, n, len(gaps))


def reference_percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 < q <= 100) by numpy's ``'linear'`` method; NaN if empty.

    Spelled out: sort, virtual index ``h = (len − 1)·q/100``, interpolate between
    ``x[⌊h⌋]`` and ``x[⌊h⌋+1]`` from the nearer end (numpy's ``_lerp``).
    """
    if not values:
        return NAN
    xs = sorted(values)
    virtual = (len(xs) - 1) * (q / 100.0)
    if virtual >= len(xs) - 1:
        return xs[-1]
    lo = math.floor(virtual)
    gamma = virtual - lo
    a, b = xs[lo], xs[lo + 1]
    if gamma >= 0.5:
        return b - (b - a) * (1.0 - gamma)
    return a + (b - a) * gamma


def reference_quantile_lower(values: Sequence[float], q: float) -> float:
    """The exact ``q``-quantile (0 <= q <= 1) by the sketch's rank convention; NaN if empty.

    The value of rank ``r = max(1, ⌈q·n⌉)`` (1-based) in ascending order, where ``⌈q·n⌉``
    forgives binary rounding of ``q`` by 1e-9 (so 0.07·100 is rank 7, not 8).
    """
    xs = sorted(v for v in values if not math.isnan(v))
    if not xs:
        return NAN
    rank = max(1, math.ceil(q * len(xs) - 1e-9))
    return xs[min(rank, len(xs)) - 1]


def reference_judge(
    records: Sequence[RequestRecord], objectives: Sequence[Objective]
) -> tuple[list[bool], list[list[bool]], list[bool]]:
    """``(good, met, judged)`` per request, as :func:`exporters.slo.judge` defines them."""
    good: list[bool] = []
    met: list[list[bool]] = []
    judged: list[bool] = []
    for record in records:
        lat = reference_latencies(record)
        row: list[bool] = []
        counted: list[bool] = []
        for objective in objectives:
            value = _reference_value(record, lat, objective)
            is_measured = reference_measured(record, objective)
            row.append(is_measured and (math.isnan(value) or value <= objective.threshold_s))
            counted.append(row[-1] or not is_measured)
        is_judged = record.final and record.status in (Status.OK, Status.ERROR)
        judged.append(is_judged)
        good.append(is_judged and record.status == Status.OK and all(counted))
        met.append(row)
    return good, met, judged


def reference_measured(record: RequestRecord, objective: Objective) -> bool:
    """Whether ``record`` carries ``objective``'s metric (value, or known to be undefined)."""
    if objective.metric == Metric.ITL:
        lat = reference_latencies(record)
        return record.token_detail == TokenDetail.FULL or lat.output_tokens < 2
    if objective.metric == Metric.E2EL:
        return bool(len(record.emission_offsets_us)) or (
            int(record.phase_offsets_us[Phase.FINISHED]) >= 0
        )
    return True


def _reference_value(record: RequestRecord, lat: ReferenceLatencies, objective: Objective) -> float:
    if objective.metric == Metric.TTFT:
        return lat.ttft_s
    if objective.metric == Metric.TPOT:
        return lat.tpot_s
    if objective.metric == Metric.E2EL:
        return lat.e2el_s
    if objective.statistic == "max":
        return lat.itl_max_s
    return reference_percentile(reference_gaps_s(record), float(objective.statistic[1:]))
