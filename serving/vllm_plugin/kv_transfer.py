"""KV transfer stats of our KV connector and their Prometheus families (pure: no vLLM import).

vLLM's path for connector telemetry: the worker-side connector collects a
``KVConnectorStats`` (``get_kv_connector_stats()``, called by the model runner after every
step that ran the connector), the engine core ships ``to_dict()`` of it in
``SchedulerStats.kv_connector_stats``, and in the API-server process every stat logger
receives that dict; vLLM's own loggers rebuild the object with the connector class's
``build_kv_connector_stats(data)`` and log its ``reduce()``.
:class:`serving.workers.kv_connector.AtomicExampleConnector` records into a
:class:`KVTransferStats` (this class plus vLLM's base, so vLLM's loggers can use it), and the
stat-logger plugin feeds the shipped dicts to a :class:`KVTransferCollector`, which serves
the families the sim workers export, on vLLM's ``/metrics``:

* ``goodput_kv_transfer_bytes_total{model,vantage}`` and the histogram
  ``goodput_kv_transfer_seconds{model,vantage}``: one observation per prompt whose KV cache
  this instance *loaded* from the shared folder (the decode side of the hand-off), its
  tensor bytes and the time the load took (the step waits for it: the load is synchronous);
* ``goodput_kv_save_bytes_total{model,vantage}`` and ``goodput_kv_save_seconds``: one per
  prompt whose KV cache this instance wrote and published (the prefill side: the layer
  writes during the forward pass plus the publishing ``rename``).

``vantage`` is ``engine``, as on the sim workers' records. A direction gets its series on
its first observation, so a pure prefill instance exports no ``kv_transfer`` series.
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from exporters.buckets import bucket_index, validate_buckets
from exporters.prometheus import KV_TRANSFER_BUCKETS_S

__all__ = ["DIRECTIONS", "KVTransferCollector", "KVTransferStats"]

#: ``direction -> (seconds key, bytes key)`` in :attr:`KVTransferStats.data`.
DIRECTIONS: dict[str, tuple[str, str]] = {
    "load": ("load_seconds", "load_bytes"),
    "save": ("save_seconds", "save_bytes"),
}
_KEYS = tuple(key for pair in DIRECTIONS.values() for key in pair)


@dataclass
class KVTransferStats:
    """Transfers since the last :meth:`clone_and_reset`: parallel lists per direction.

    The interface is vLLM's ``KVConnectorStats`` (``data`` must stay plain lists of numbers:
    it crosses processes as msgpack). ``aggregate`` appends ``other``'s observations in
    place (the scheduler merges the stats of tensor-parallel workers this way, each rank
    reporting its own shard of a prompt); ``reduce`` summarises them for vLLM's log line.
    """

    data: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        data, self.data = self.data, {}
        self.reset()
        for key in _KEYS:
            self.data[key].extend(data.get(key, ()))

    def reset(self) -> None:
        self.data = {key: [] for key in _KEYS}

    def to_dict(self) -> dict[str, Any]:
        return self.data

    def record_load(self, seconds: float, num_bytes: int) -> None:
        self.data["load_seconds"].append(float(seconds))
        self.data["load_bytes"].append(int(num_bytes))

    def record_save(self, seconds: float, num_bytes: int) -> None:
        self.data["save_seconds"].append(float(seconds))
        self.data["save_bytes"].append(int(num_bytes))

    def is_empty(self) -> bool:
        return not (self.data["load_seconds"] or self.data["save_seconds"])

    def aggregate(self, other: Any) -> Any:
        """Append ``other``'s observations (any stats whose ``data`` has these keys)."""
        data: Mapping[str, Sequence[float]] = getattr(other, "data", None) or {}
        for key in _KEYS:
            self.data[key].extend(data.get(key, ()))
        return self

    def clone_and_reset(self) -> Self:
        """A copy holding the observations so far; this object starts empty again."""
        old = copy.copy(self)
        self.reset()
        return old

    def reduce(self) -> dict[str, int | float]:
        """Count, MB, mean and max time (ms) per direction, for vLLM's periodic log line."""
        out: dict[str, int | float] = {}
        for direction, (seconds_key, bytes_key) in DIRECTIONS.items():
            seconds = self.data[seconds_key]
            out[f"Num {direction}s"] = len(seconds)
            out[f"{direction.capitalize()} MB"] = round(sum(self.data[bytes_key]) / 2**20, 3)
            mean = sum(seconds) / len(seconds) if seconds else 0.0
            out[f"Avg {direction} time (ms)"] = round(mean * 1e3, 3)
            out[f"Max {direction} time (ms)"] = round(max(seconds, default=0.0) * 1e3, 3)
        return out


_FAMILIES = {
    "load": (
        "goodput_kv_transfer_bytes",
        "KV-cache bytes received from another instance (the PD hand-off).",
        "goodput_kv_transfer_seconds",
        "KV hand-off time: from its start until the prompt's KV cache is in place.",
    ),
    "save": (
        "goodput_kv_save_bytes",
        "KV-cache bytes written for another instance to load (the PD hand-off's sender).",
        "goodput_kv_save_seconds",
        "Time to write and publish a prompt's KV cache for another instance.",
    ),
}
_LABELS = ("model", "vantage")


class _Histogram:
    """Cumulative-at-scrape histogram of one direction, plus its bytes counter."""

    def __init__(self, bounds: np.ndarray) -> None:
        self.bounds = bounds
        self.counts = np.zeros(bounds.shape[0] + 1, dtype=np.int64)  # per bucket, +Inf last
        self.sum_s = 0.0
        self.num_bytes = 0

    def add(self, seconds: Sequence[float], num_bytes: Sequence[float]) -> None:
        values = np.asarray(seconds, dtype=np.float64)
        values = values[np.isfinite(values) & (values >= 0)]
        if values.shape[0]:
            index = bucket_index(values, self.bounds)
            self.counts += np.bincount(index, minlength=self.counts.shape[0])
            self.sum_s += float(values.sum())
        self.num_bytes += sum(int(b) for b in num_bytes if b > 0)


class KVTransferCollector(Collector):
    """``goodput_kv_transfer_*`` and ``goodput_kv_save_*`` of one engine (module doc).

    :meth:`observe` takes the ``SchedulerStats.kv_connector_stats`` dict of one step (keys
    it does not know, another connector's, are ignored); :meth:`collect` runs at scrape
    time in the server's metrics thread, hence the lock.
    """

    def __init__(
        self,
        model: str,
        *,
        vantage: str = "engine",
        buckets: Sequence[float] = KV_TRANSFER_BUCKETS_S,
    ) -> None:
        self.buckets = validate_buckets(list(buckets))
        self._bounds = np.asarray(self.buckets, dtype=np.float64)
        self._le = [*map(floatToGoString, self.buckets), "+Inf"]
        self._values = [model, vantage]
        self._lock = threading.Lock()
        self._histograms: dict[str, _Histogram] = {}

    def observe(self, data: Mapping[str, Any]) -> None:
        for direction, (seconds_key, bytes_key) in DIRECTIONS.items():
            seconds = data.get(seconds_key)
            if not seconds:
                continue
            with self._lock:
                histogram = self._histograms.get(direction)
                if histogram is None:
                    histogram = self._histograms[direction] = _Histogram(self._bounds)
                histogram.add(seconds, data.get(bytes_key) or ())

    def describe(self) -> Iterator[Metric]:
        for direction in DIRECTIONS:
            yield from self._families(direction)

    def collect(self) -> Iterator[Metric]:
        for direction in DIRECTIONS:
            total, seconds = self._families(direction)
            with self._lock:
                histogram = self._histograms.get(direction)
                if histogram is not None:
                    cumulative = np.cumsum(histogram.counts).tolist()
                    total.add_metric(self._values, histogram.num_bytes)
                    seconds.add_metric(
                        self._values,
                        buckets=list(zip(self._le, cumulative, strict=True)),
                        sum_value=histogram.sum_s if math.isfinite(histogram.sum_s) else 0.0,
                    )
            yield from (total, seconds)

    @staticmethod
    def _families(direction: str) -> tuple[CounterMetricFamily, HistogramMetricFamily]:
        bytes_name, bytes_help, seconds_name, seconds_help = _FAMILIES[direction]
        return (
            CounterMetricFamily(bytes_name, bytes_help, labels=_LABELS),
            HistogramMetricFamily(seconds_name, seconds_help, labels=_LABELS),
        )
