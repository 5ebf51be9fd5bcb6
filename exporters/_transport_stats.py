"""Counters of the control-plane exporter: a snapshot type and a Prometheus collector.

Private: :mod:`exporters.transport` exports the public names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["ControlPlaneExporterStats", "ExporterStatsCollector"]


@dataclass(frozen=True, slots=True)
class ControlPlaneExporterStats:
    """A consistent snapshot of a :class:`~exporters.transport.ControlPlaneExporter`.

    Every record handed to ``export`` ends in exactly one of ``num_exported_records``,
    ``num_dropped_records`` or ``num_rejected_records``, or is still waiting
    (``num_pending_records`` not yet encoded, or inside the ``buffer_bytes`` of encoded
    batches). Nothing is lost without being counted.
    """

    exporter_id: str
    num_exported_records: int  # acknowledged (2xx) by the control plane
    num_dropped_records: int  # buffer full (oldest first), after shutdown, or left at shutdown
    num_dropped_bytes: int  # encoded bytes of dropped batches
    num_rejected_records: int  # refused by the control plane (4xx but 429) or not encodable
    num_rejected_batches: int
    num_sent_batches: int  # acknowledged batches
    num_retries: int  # failed attempts (unreachable, 5xx, 429) that were kept for a retry
    num_pending_records: int  # received, not yet encoded into a batch
    num_buffered_batches: int  # encoded, waiting for (re)delivery
    buffer_bytes: int  # encoded bytes waiting for (re)delivery


# (stats field, metric name without _total, help); counters first, then gauges.
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("num_exported_records", "goodput_exporter_exported_records",
     "Records acknowledged by the control plane."),
    ("num_dropped_records", "goodput_exporter_dropped_records",
     "Records dropped by the exporter (buffer full, shut down)."),
    ("num_dropped_bytes", "goodput_exporter_dropped_bytes",
     "Encoded bytes of the batches the exporter dropped."),
    ("num_rejected_records", "goodput_exporter_rejected_records",
     "Records the control plane refused as invalid (HTTP 4xx other than 429)."),
    ("num_rejected_batches", "goodput_exporter_rejected_batches",
     "Batches the control plane refused as invalid (HTTP 4xx other than 429)."),
    ("num_sent_batches", "goodput_exporter_sent_batches",
     "Batches acknowledged by the control plane."),
    ("num_retries", "goodput_exporter_retries",
     "Delivery attempts that failed and were retried (unreachable, 5xx, 429)."),
)  # fmt: skip
_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("buffer_bytes", "goodput_exporter_buffer_bytes",
     "Encoded bytes waiting for delivery to the control plane."),
    ("num_buffered_batches", "goodput_exporter_buffered_batches",
     "Encoded batches waiting for delivery to the control plane."),
    ("num_pending_records", "goodput_exporter_pending_records",
     "Records received and not yet encoded into a batch."),
)  # fmt: skip


class ExporterStatsCollector(Collector):
    """Exposes a stats snapshot at scrape time (no work on the export path).

    One exporter per registry: the metric names carry no exporter label, so a second
    exporter on the same registry is refused by the registry as a duplicate.
    """

    def __init__(self, stats: Callable[[], ControlPlaneExporterStats]) -> None:
        self._stats = stats

    def describe(self) -> Iterator[Metric]:
        for _, name, doc in _COUNTERS:
            yield CounterMetricFamily(name, doc)
        for _, name, doc in _GAUGES:
            yield GaugeMetricFamily(name, doc)

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        for field, name, doc in _COUNTERS:
            yield CounterMetricFamily(name, doc, value=getattr(stats, field))
        for field, name, doc in _GAUGES:
            yield GaugeMetricFamily(name, doc, value=getattr(stats, field))
