"""Latency histogram bucket boundaries shared by the Prometheus and OpenTelemetry exporters.

SLO thresholds are round numbers (TTFT ≤ 200 ms, ITL ≤ 50 ms, TPOT ≤ 25 ms, …). Every
such threshold in common use — 10, 20, 25, 50, 100, 200, 250, 500 ms, 1 s and more — is a
bucket boundary here, so the share of requests under a threshold read from a histogram,
``rate(goodput_request_ttft_seconds_bucket{le="0.2"}[5m]) /
rate(goodput_request_ttft_seconds_count[5m])``, is an exact count and not an interpolation.
The ratio of neighbouring boundaries is at most 1.5 from 5 ms to 30 s (the range where
SLOs live), 2.5 at most outside it; that bounds how far ``histogram_quantile`` can misplace
a percentile by interpolating inside a bucket.

Latencies come from :mod:`exporters.latency`, which computes each value as an exact integer
number of µs divided once by 10⁶ (or, for TPOT, one division of exact integers). The float
is therefore the correctly rounded value, and so is each boundary written as a decimal
literal: a latency of exactly 200 ms equals ``0.2`` and lands in ``le="0.2"``, as
Prometheus's ``le`` (less than or equal) requires. :func:`bucket_index` relies on that.

Example::

    idx = bucket_index(np.array([0.0004, 0.2, 0.2000001, 400.0]))
    # -> [0, 16, 17, 37]: le=0.001, le=0.2, le=0.25, +Inf
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["LATENCY_BUCKETS_S", "bucket_counts", "bucket_index", "validate_buckets"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

#: Upper bounds in seconds (``le``), ascending; ``+Inf`` is implied after the last one.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.0075,
    0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075,
    0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5,
    10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip


def validate_buckets(buckets: tuple[float, ...] | list[float]) -> tuple[float, ...]:
    """Return ``buckets`` as a tuple after checking they are finite, > 0 and increasing."""
    bounds = tuple(float(b) for b in buckets)
    if not bounds:
        raise ValueError("buckets: need at least one finite boundary, got none")
    for i, b in enumerate(bounds):
        if not np.isfinite(b) or b <= 0:
            raise ValueError(f"buckets[{i}]: must be finite and > 0, got {b}")
        if i and b <= bounds[i - 1]:
            raise ValueError(
                f"buckets[{i}]: must be strictly increasing, got {b} after {bounds[i - 1]}"
            )
    return bounds


def bucket_index(values_s: F64, buckets: F64 | None = None) -> I64:
    """Index of the bucket each value falls in: ``i`` such that ``b[i-1] < v <= b[i]``.

    ``len(buckets)`` is the ``+Inf`` bucket. NaN values also map to ``len(buckets)``; callers
    drop undefined values before counting.
    """
    bounds = _BOUNDS if buckets is None else buckets
    idx: I64 = np.searchsorted(bounds, values_s, side="left").astype(np.int64)
    return idx


def bucket_counts(values_s: F64, groups: I64, num_groups: int, buckets: F64) -> I64:
    """Per-bucket (not cumulative) counts per group, shape ``(num_groups, len(buckets) + 1)``.

    One ``bincount`` over ``group * (len(buckets) + 1) + bucket``: no Python loop per value.
    Callers add these to running totals and take the ``cumsum`` at scrape time.
    """
    width = buckets.shape[0] + 1
    flat = groups * width + bucket_index(values_s, buckets)
    counts: I64 = np.bincount(flat, minlength=num_groups * width).astype(np.int64)
    return counts.reshape(num_groups, width)


_BOUNDS: F64 = np.asarray(LATENCY_BUCKETS_S, dtype=np.float64)
