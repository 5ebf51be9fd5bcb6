"""Prometheus view of the goodput engine: a custom Collector computed at scrape time.

Register it on a registry you pass in (never the global one implicitly)::

    registry = CollectorRegistry()
    registry.register(GoodputCollector(engine))

Metrics (``slo`` is the SLO's name; ``window`` is ``10s``, ``1m``, ``5m``, ``1h``, ``1d``
or ``compliance``), with the PromQL that reads them:

* ``goodput_requests_total{slo,vantage,result}`` (counter; result
  ``good|bad|rejected|aborted``; ``vantage``, ``gateway`` or ``engine``, is where the SLO
  judges, one per SLO: it names the series' origin at no cost in series).
  Attainment over any range: ``sum by (slo) (rate(goodput_requests_total{result="good"}[5m]))
  / sum by (slo) (rate(goodput_requests_total{result=~"good|bad"}[5m]))``.
* ``goodput_slo_violations_total{slo,objective}`` (counter; objective key, e.g. ``itl_p99``).
* ``goodput_slo_objective_measured_total{slo,objective}`` (counter): judged requests whose
  record carried the objective's metric (an ITL objective on vLLM's stat-logger records or
  OTLP spans is not measured; docs/metrics.md). Measured share over 5 minutes:
  ``sum by (slo, objective) (rate(goodput_slo_objective_measured_total[5m]))
  / on (slo) group_left sum by (slo) (rate(goodput_requests_total{result=~"good|bad"}[5m]))``.
  Same series as the violations (one per objective key).
* ``goodput_attainment_ratio{slo,window}`` = good / judged (absent when nothing was judged).
* ``goodput_requests_per_second{slo,window}``: goodput, good requests per second.
* ``goodput_burn_rate{slo,window}`` = (1 − attainment) / (1 − target). Fast-burn alert:
  ``goodput_burn_rate{window="1h"} > 14.4 and goodput_burn_rate{window="5m"} > 14.4``.
* ``goodput_error_budget_remaining_ratio{slo}`` over the compliance window (may be < 0).
* ``goodput_availability_ratio{slo,window}`` = admitted / (admitted + rejected).
* ``goodput_requests_in_flight{slo}``: requests with a partial record and no final one.
* ``goodput_slo_threshold_seconds{slo,objective,metric,vantage}``: each objective's
  threshold, so dashboards draw it next to the percentiles (``dashboards/``).
* ``goodput_slo_objective_ratio{slo,sli}``: the SLO's target (``sli="goodput"``) and its
  availability target (``sli="availability"``, when it has one); ``goodput_slo_window_seconds{slo}``
  its compliance window; ``goodput_slo_info{slo,slo_id,slo_version,objective,vantage}`` = 1.
  The rules for all SLOs (``dashboards.shared_rules``) read targets and windows from these
  and join the info labels into their alerts:
  ``... * on (slo) group_left (slo_version, objective) goodput_slo_info``.
* ``goodput_{ttft,tpot,itl,e2el}_seconds{slo}`` (histograms of successful requests, ITL
  over every gap; buckets ``exporters.buckets.LATENCY_BUCKETS_S``):
  ``histogram_quantile(0.99, sum by (slo, le) (rate(goodput_ttft_seconds_bucket[5m])))``.
* ``goodput_engine_records_total{outcome}``: ``final``, ``in_flight`` (partial updates),
  ``late`` (kept in coarse buckets only), ``dropped_late``, ``dropped_future``;
  ``goodput_engine_dry_run_evicted_total``: rows the dry-run store evicted at its cap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from controlplane.goodput._batch import METRICS
from controlplane.goodput.engine import GoodputEngine
from controlplane.goodput.stats import COMPLIANCE, STANDARD_WINDOWS
from dashboards.rules import objectives_text
from exporters.buckets import LATENCY_BUCKETS_S

__all__ = ["GoodputCollector"]

_RESULTS = ("good", "bad", "rejected", "aborted")
_LE = (*(format(b, "g") for b in LATENCY_BUCKETS_S), "+Inf")


@dataclass(slots=True)
class _Families:
    """One scrape's metric families (fresh each time: the collector holds no state)."""

    requests: CounterMetricFamily
    violations: CounterMetricFamily
    measured: CounterMetricFamily
    attainment: GaugeMetricFamily
    goodput: GaugeMetricFamily
    burn_rate: GaugeMetricFamily
    budget: GaugeMetricFamily
    availability: GaugeMetricFamily
    in_flight: GaugeMetricFamily
    thresholds: GaugeMetricFamily
    objective_ratio: GaugeMetricFamily
    window: GaugeMetricFamily
    info: GaugeMetricFamily
    histograms: tuple[HistogramMetricFamily, ...]
    records: CounterMetricFamily
    evicted: CounterMetricFamily

    @classmethod
    def new(cls) -> _Families:
        slo, window = ["slo"], ["slo", "window"]
        return cls(
            requests=CounterMetricFamily(
                "goodput_requests",
                "Requests finished per SLO by result (good, bad, rejected, aborted), "
                "judged at the SLO's vantage.",
                labels=["slo", "vantage", "result"],
            ),
            violations=CounterMetricFamily(
                "goodput_slo_violations",
                "Judged requests that broke an SLO objective, by objective key.",
                labels=["slo", "objective"],
            ),
            measured=CounterMetricFamily(
                "goodput_slo_objective_measured",
                "Judged requests whose record carried the objective's metric, by objective key.",
                labels=["slo", "objective"],
            ),
            attainment=GaugeMetricFamily(
                "goodput_attainment_ratio", "Good / judged requests over the window.", labels=window
            ),
            goodput=GaugeMetricFamily(
                "goodput_requests_per_second",
                "Goodput: good requests per second over the window.",
                labels=window,
            ),
            burn_rate=GaugeMetricFamily(
                "goodput_burn_rate",
                "(1 - attainment) / (1 - target) over the window.",
                labels=window,
            ),
            budget=GaugeMetricFamily(
                "goodput_error_budget_remaining_ratio",
                "1 - (bad / judged) / (1 - target) over the compliance window.",
                labels=slo,
            ),
            availability=GaugeMetricFamily(
                "goodput_availability_ratio",
                "Admitted / (admitted + rejected) requests over the window.",
                labels=window,
            ),
            in_flight=GaugeMetricFamily(
                "goodput_requests_in_flight",
                "Requests with a partial record and no final record yet.",
                labels=slo,
            ),
            thresholds=GaugeMetricFamily(
                "goodput_slo_threshold_seconds",
                "Threshold of each SLO objective (a request meets it at or below), seconds.",
                labels=["slo", "objective", "metric", "vantage"],
            ),
            objective_ratio=GaugeMetricFamily(
                "goodput_slo_objective_ratio",
                "Target of each SLI of an SLO (goodput: good / judged; availability: "
                "admitted / (admitted + rejected)).",
                labels=["slo", "sli"],
            ),
            window=GaugeMetricFamily(
                "goodput_slo_window_seconds", "Compliance window of the SLO, seconds.", labels=slo
            ),
            info=GaugeMetricFamily(
                "goodput_slo_info",
                "The SLO's registry id, version, objectives and vantage as labels; value 1.",
                labels=["slo", "slo_id", "slo_version", "objective", "vantage"],
            ),
            histograms=tuple(
                HistogramMetricFamily(
                    f"goodput_{name}_seconds",
                    f"{name.upper()} of successful requests selected by the SLO, seconds.",
                    labels=slo,
                )
                for name in METRICS
            ),
            records=CounterMetricFamily(
                "goodput_engine_records",
                "Records ingested by the goodput engine, by outcome.",
                labels=["outcome"],
            ),
            evicted=CounterMetricFamily(
                "goodput_engine_dry_run_evicted",
                "Rows the dry-run store evicted to stay within its cap.",
                labels=[],
            ),
        )

    def all(self) -> Iterator[Metric]:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                yield from value
            else:
                yield value


class GoodputCollector:
    """Reads ``engine`` at each scrape (no state of its own). ``clock`` overrides the
    engine's clock for the window gauges (tests pass a fixed time)."""

    def __init__(
        self,
        engine: GoodputEngine,
        *,
        windows: tuple[str, ...] = (*STANDARD_WINDOWS, COMPLIANCE),
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._engine = engine
        self._windows = windows
        self._clock = clock

    def describe(self) -> Iterator[Metric]:
        """The metric names (no samples), so a registry can detect clashes."""
        return _Families.new().all()

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        now = self._clock() if self._clock is not None else None
        fam = _Families.new()
        vantages = {spec.id: spec.vantage.name.lower() for spec in engine.slos}
        for t in engine.totals(now):
            vantage = vantages.get(t.slo_id, "")
            for result in _RESULTS:
                fam.requests.add_metric([t.slo_name, vantage, result], getattr(t, result))
            for key, value in t.violations.items():
                fam.violations.add_metric([t.slo_name, key], value)
            for key, value in t.measured.items():
                fam.measured.add_metric([t.slo_name, key], value)
            fam.in_flight.add_metric([t.slo_name], t.in_flight)
            for family, name in zip(fam.histograms, METRICS, strict=True):
                h = t.histograms[name]
                cumulative, running = [], 0
                for le, count in zip(_LE, h.bucket_counts, strict=True):
                    running += count
                    cumulative.append((le, float(running)))
                family.add_metric([t.slo_name], cumulative, h.sum_s)
        for window in self._windows:
            for s in engine.summary(now, window, percentiles=False):
                labels = [s.slo_name, window]
                fam.goodput.add_metric(labels, s.goodput_rps)
                _add_if(fam.attainment, labels, s.attainment_ratio)
                _add_if(fam.burn_rate, labels, s.burn_rate)
                _add_if(fam.availability, labels, s.availability_ratio)
                if window == COMPLIANCE:
                    fam.budget.add_metric([s.slo_name], s.error_budget_remaining_ratio)
        for spec in engine.slos:
            vantage = spec.vantage.name.lower()
            for key, objective in zip(spec.objective_keys, spec.objectives, strict=True):
                labels = [spec.name, key, objective.metric.value, vantage]
                fam.thresholds.add_metric(labels, objective.threshold_s)
            fam.objective_ratio.add_metric([spec.name, "goodput"], spec.target)
            if spec.availability_target is not None:
                fam.objective_ratio.add_metric(
                    [spec.name, "availability"], spec.availability_target
                )
            fam.window.add_metric([spec.name], spec.window_s)
            info = [
                spec.name,
                spec.id,
                str(spec.version),
                objectives_text(spec.objectives),
                vantage,
            ]
            fam.info.add_metric(info, 1.0)
        health = engine.health()
        for outcome, value in (
            ("final", health.final),
            ("in_flight", health.in_flight_updates),
            ("late", health.late),
            ("dropped_late", health.dropped_late),
            ("dropped_future", health.dropped_future),
        ):
            fam.records.add_metric([outcome], value)
        fam.evicted.add_metric([], health.recent_evicted)
        return fam.all()


def _add_if(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    # An undefined ratio (nothing judged) is absent, not NaN: alerts then see no data.
    if value is not None and math.isfinite(value):
        family.add_metric(labels, value)
