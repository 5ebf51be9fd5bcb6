"""The gateway's own Prometheus metrics, beside the request histograms of
:class:`~exporters.prometheus.PrometheusExporter` on the same (per-gateway) registry.

* ``goodput_gateway_upstream_requests_total{pool,outcome}``: calls to upstream instances
  (``pool`` prefill, decode or colocated; ``outcome`` ok, error or aborted);
* ``goodput_gateway_retries_total{pool}``: calls retried on another instance;
* ``goodput_gateway_in_flight_requests``: client requests being served now;
* ``goodput_gateway_fleet_refresh_failures_total``: fleet-registry reads that failed (the
  gateway then keeps the membership it last knew);
* ``goodput_gateway_instances{role,state}``: instances by role and state (``eligible``,
  ``cooling_down``, ``unhealthy``), computed at scrape time from the pool.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from serving.gateway.routing import InstanceState

__all__ = ["GatewayMetrics"]

_POOLS = ("prefill", "decode", "colocated")
_OUTCOMES = ("ok", "error", "aborted")


class GatewayMetrics:
    """Counters bound once (no label lookup per request) on the given registry."""

    def __init__(
        self,
        registry: CollectorRegistry,
        states: Callable[[], list[InstanceState]],
        in_flight: Callable[[], int],
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        upstream = Counter(
            "goodput_gateway_upstream_requests",
            "Calls to upstream instances by pool and outcome.",
            ("pool", "outcome"),
            registry=registry,
        )
        retries = Counter(
            "goodput_gateway_retries",
            "Upstream calls retried on another instance.",
            ("pool",),
            registry=registry,
        )
        self.upstream = {(p, o): upstream.labels(p, o) for p in _POOLS for o in _OUTCOMES}
        self.retries = {p: retries.labels(p) for p in _POOLS}
        Gauge(
            "goodput_gateway_in_flight_requests",
            "Client requests being served now.",
            registry=registry,
        ).set_function(in_flight)
        self.fleet_failures = Counter(
            "goodput_gateway_fleet_refresh_failures",
            "Fleet-registry reads that failed; the last known membership is kept.",
            registry=registry,
        )
        registry.register(_InstancesCollector(states, clock_s))


class _InstancesCollector(Collector):
    def __init__(self, states: Callable[[], list[InstanceState]], clock_s: Callable[[], float]):
        self._states = states
        self._clock_s = clock_s

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "goodput_gateway_instances", "Instances by role and state.", labels=("role", "state")
        )

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "goodput_gateway_instances", "Instances by role and state.", labels=("role", "state")
        )
        now = self._clock_s()
        tally: Tally[tuple[str, str]] = Tally()
        for s in self._states():
            if not s.healthy:
                state = "unhealthy"
            elif s.down_until_s > now:
                state = "cooling_down"
            else:
                state = "eligible"
            tally[(s.role.value, state)] += 1
        for (role, state), count in sorted(tally.items()):
            family.add_metric([role, state], count)
        yield family
