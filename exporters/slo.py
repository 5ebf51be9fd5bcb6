"""Per-request SLO verdicts: which requests meet their objectives, exactly and vectorised.

An :class:`Objective` is a threshold on one per-request latency metric. :func:`judge` tells,
for every request of a batch, whether each objective is met, whether the request counts
toward attainment (*judged*) and whether it is *good*. The rules (docs/metrics.md):

* thresholds are inclusive: ``value <= threshold_s`` is met;
* an objective on a metric that is *undefined* for the request is met (TPOT with n < 2,
  ITL with fewer than two emissions, TTFT without a token), as ``vllm bench serve`` does;
* an objective on a metric the record does not *carry* is unmeasured, neither met nor
  violated: ITL of a ``SUMMARY`` record of n >= 2 tokens (vLLM's stat-logger records, OTLP
  spans without token events), E2EL of a record with neither a token nor a finish time;
* judged = final and status ``OK`` or ``ERROR``; ``ERROR`` requests are judged and bad;
  ``ABORTED``, ``REJECTED`` and in-flight records are not judged;
* good = judged, status ``OK`` and every *measured* objective met (a request is judged on
  the objectives that were measured on it; the measured share is reported beside).

Example::

    objectives = [Objective(Metric.TTFT, 0.2), Objective(Metric.ITL, 0.05, "p99")]
    verdicts = judge(batch, objectives)
    attainment = verdicts.num_good / verdicts.num_judged
    itl_measured_ratio = verdicts.num_measured[1] / verdicts.num_judged
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from exporters.latency import ItlGroups, RequestLatencies, request_latencies
from exporters.records import RecordBatch, Status

__all__ = ["Metric", "Objective", "SLOError", "Verdicts", "judge"]

B = npt.NDArray[np.bool_]
F64 = npt.NDArray[np.float64]

_PERCENTILE = re.compile(r"p(\d{1,3}(?:\.\d+)?)")


class SLOError(ValueError):
    """An objective or judge input that breaks the contract; the message names the field."""


class Metric(StrEnum):
    """The per-request latency metric an objective constrains."""

    TTFT = "ttft"
    TPOT = "tpot"
    ITL = "itl"
    E2EL = "e2el"


@dataclass(frozen=True, slots=True)
class Objective:
    """``metric`` of each request must be ``<= threshold_s`` (inclusive).

    ``statistic`` says which value of the request is compared. TTFT, TPOT and E2EL have one
    value per request, so their statistic is always ``"max"`` (the default). ITL has one
    value per gap: ``"max"`` (every gap within the threshold) or a per-request percentile
    ``"pNN"`` / ``"pNN.N"`` with ``0 < NN <= 100`` (``"p99"``, ``"p99.9"``), computed as
    :func:`exporters.latency.itl_percentile_s` defines it. ``metric`` may be given as its
    string value (``"ttft"``); it is stored as a :class:`Metric`.

    >>> Objective(Metric.ITL, 0.05, "p99").percentile
    99.0
    """

    metric: Metric
    threshold_s: float
    statistic: str = "max"

    def __post_init__(self) -> None:
        try:
            metric = Metric(self.metric)
        except ValueError:
            raise SLOError(
                f"objective.metric must be one of {[m.value for m in Metric]}, got {self.metric!r}"
            ) from None
        object.__setattr__(self, "metric", metric)
        threshold = self.threshold_s
        if isinstance(threshold, bool) or not isinstance(
            threshold, int | float | np.integer | np.floating
        ):
            raise SLOError(f"objective.threshold_s must be a number, got {threshold!r}")
        if not math.isfinite(threshold):
            raise SLOError(f"objective.threshold_s must be finite, got {threshold}")
        if threshold <= 0:
            raise SLOError(f"objective.threshold_s must be > 0, got {threshold}")
        object.__setattr__(self, "threshold_s", float(threshold))
        statistic = self.statistic
        if not isinstance(statistic, str):
            raise SLOError(f"objective.statistic must be a string, got {statistic!r}")
        if statistic == "max":
            return
        if metric is not Metric.ITL:
            raise SLOError(
                f"objective.statistic for {metric.value} must be 'max' "
                f"(one value per request), got {statistic!r}"
            )
        match = _PERCENTILE.fullmatch(statistic)
        if match is None or not 0.0 < float(match.group(1)) <= 100.0:
            raise SLOError(
                "objective.statistic for itl must be 'max' or 'pNN' with 0 < NN <= 100 "
                f"(e.g. 'p99', 'p99.9'), got {statistic!r}"
            )

    @property
    def percentile(self) -> float | None:
        """The percentile (0 < p <= 100) of a ``"pNN"`` statistic; ``None`` for ``"max"``."""
        if self.statistic == "max":
            return None
        return float(self.statistic[1:])


@dataclass(frozen=True, slots=True)
class Verdicts:
    """Verdicts for the N requests of a batch against K objectives.

    ``measured[i, k]``: request *i*'s record carries what objective *k* needs (a value, or
    the knowledge that the metric is undefined for it). ``met[i, k]``: objective *k*
    measured and met by request *i* (also computed for rows that are not judged); an
    unmeasured objective is neither met nor :attr:`violated`. ``judged[i]``: counts toward
    attainment (final, status ``OK`` or ``ERROR``). ``good[i]``: judged, status ``OK`` and
    every measured objective met; ``good`` implies ``judged``.
    """

    good: B
    met: B
    judged: B
    measured: B

    @property
    def violated(self) -> B:
        """``(N, K)``: objective *k* measured on request *i* and not met."""
        violated: B = self.measured & ~self.met
        return violated

    @property
    def num_good(self) -> int:
        return int(np.count_nonzero(self.good))

    @property
    def num_judged(self) -> int:
        return int(np.count_nonzero(self.judged))

    @property
    def num_measured(self) -> list[int]:
        """Per objective, the judged requests on which it was measured."""
        counts = np.count_nonzero(self.measured & self.judged[:, None], axis=0)
        return [int(c) for c in counts.tolist()]


def judge(
    batch: RecordBatch,
    objectives: Sequence[Objective],
    latencies: RequestLatencies | None = None,
) -> Verdicts:
    """Judge every request of ``batch`` against ``objectives`` (all apply to every row).

    Without ``latencies`` the batch is validated and its latencies computed; pass
    ``latencies`` (from :func:`request_latencies` on this same, validated batch) to reuse
    them. ITL percentiles share one sort of the gaps whatever the number of objectives.
    Raises :class:`SLOError` for a non-Objective entry or ``latencies`` of the wrong length,
    and :class:`~exporters.records.RecordError` for an invalid batch.
    """
    for k, objective in enumerate(objectives):
        if not isinstance(objective, Objective):
            raise SLOError(f"objectives[{k}] must be an Objective, got {objective!r}")
    n = len(batch)
    if latencies is None:
        latencies = request_latencies(batch, validate=True)
    elif len(latencies) != n:
        raise SLOError(f"latencies: expected {n} rows (one per request), got {len(latencies)}")

    met = np.empty((n, len(objectives)), dtype=np.bool_)
    measured = np.empty((n, len(objectives)), dtype=np.bool_)
    groups: ItlGroups | None = None
    for k, objective in enumerate(objectives):
        percentile = objective.percentile
        values: F64
        if percentile is not None:
            if groups is None:
                groups = ItlGroups.of(batch)
            values = groups.percentile(percentile)
        else:
            values = _single_value(latencies, objective.metric)
        measured[:, k] = _measured(latencies, objective.metric)
        # NaN (undefined) is met: `not (v > t)` is true for NaN and inclusive at v == t.
        met[:, k] = measured[:, k] & ~(values > objective.threshold_s)

    status = batch.status
    judged = batch.final & ((status == Status.OK) | (status == Status.ERROR))
    # Good: every objective met or unmeasured (judged on the measured ones).
    good = judged & (status == Status.OK) & (met | ~measured).all(axis=1)
    return Verdicts(good=good, met=met, judged=judged, measured=measured)


def _measured(latencies: RequestLatencies, metric: Metric) -> B:
    """Rows whose record carries ``metric`` (its value, or that it is undefined)."""
    if metric is Metric.ITL:
        return latencies.itl_measured
    if metric is Metric.E2EL:
        # Undefined only without a token and without a finish time: the record lacks it.
        return ~np.isnan(latencies.e2el_s)
    # TTFT and TPOT come from the first and last emission, which every detail level keeps.
    return np.ones(len(latencies), dtype=np.bool_)


def _single_value(latencies: RequestLatencies, metric: Metric) -> F64:
    if metric is Metric.TTFT:
        return latencies.ttft_s
    if metric is Metric.TPOT:
        return latencies.tpot_s
    if metric is Metric.E2EL:
        return latencies.e2el_s
    return latencies.itl_max_s
