"""Request latency histograms and counters for Prometheus, computed at scrape time.

:class:`PrometheusExporter` is a :class:`~exporters.sinks.RecordSink` and a
``prometheus_client`` collector registered on the registry it is given (never the global
one). ``export`` appends the record to a list; at scrape time (or every ``fold_every``
records, so memory stays bounded between scrapes) the list is folded into cumulative
bucket arrays with numpy — one :func:`~exporters.latency.request_latencies` call per fold,
one ``bincount`` per histogram — so there is no Python work per token.

Metrics (labels ``model``, ``vantage`` and, with ``slo_label=True``, the ``slo`` hint):

* ``goodput_request_ttft_seconds``, ``goodput_request_tpot_seconds``,
  ``goodput_request_e2el_seconds``: histograms, one observation per successful request
  where the metric is defined (docs/metrics.md);
* ``goodput_request_itl_seconds``: one observation per ITL gap of a successful request
  (a streamed chunk of k tokens yields one gap, as ``vllm bench serve`` counts it);
* ``goodput_requests_total{status}``: finished requests by status (``ok``, ``error``,
  ``aborted``, ``rejected``);
* ``goodput_output_tokens_total``, ``goodput_prompt_tokens_total``: tokens of finished
  requests, whatever their status.

Partial records (``final=False``) are not counted: a request is counted once, when it ends.

:class:`KVTransferExporter` is a second, smaller sink for the engine side of the PD hand-off
(labels ``model``, ``vantage``), fed with the records of the instance that *receives* a
prompt's KV cache (a sim worker's decode legs):

* ``goodput_kv_transfer_bytes_total``: the records' ``kv_bytes`` (KV-cache bytes that came
  from another instance);
* ``goodput_kv_transfer_seconds``: histogram of ``KV_HANDOFF_END − KV_HANDOFF_START`` for
  records that carry both phases (buckets :data:`KV_TRANSFER_BUCKETS_S`).

Buckets come from :mod:`exporters.buckets`, so SLO thresholds sit on boundaries::

    # share of successful requests with TTFT <= 200 ms over 5 minutes
    sum(rate(goodput_request_ttft_seconds_bucket{le="0.2"}[5m]))
      / sum(rate(goodput_request_ttft_seconds_count[5m]))

Example::

    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry)
    recorder = RequestRecorder(Vantage.GATEWAY, exporter)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from exporters._fold import FoldingSink, RecordFolder
from exporters.buckets import LATENCY_BUCKETS_S, bucket_counts, validate_buckets
from exporters.latency import itl_gaps_s, request_latencies
from exporters.records import Phase, RecordBatch, Status, Vantage

__all__ = ["KV_TRANSFER_BUCKETS_S", "OVERFLOW_LABEL", "KVTransferExporter", "PrometheusExporter"]

logger = logging.getLogger(__name__)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

# The ``le`` text prometheus_client itself writes (typed here: the library's is not).
_go_float: Callable[[float], str] = floatToGoString
#: The ``model`` label value given to label sets beyond ``max_label_sets``.
OVERFLOW_LABEL = "__overflow__"
_HISTOGRAMS: tuple[tuple[str, str], ...] = (
    ("goodput_request_ttft_seconds", "Time to first token of successful requests."),
    ("goodput_request_tpot_seconds", "Mean time per output token after the first."),
    ("goodput_request_e2el_seconds", "End-to-end latency of successful requests."),
    ("goodput_request_itl_seconds", "Inter-token latency: one observation per gap."),
)
_STATUSES: tuple[Status, ...] = (Status.OK, Status.ERROR, Status.ABORTED, Status.REJECTED)


class LabelSets:
    """Label-value tuples → dense group indices, at most ``max_sets`` of them: past that, a
    new tuple is counted under :data:`OVERFLOW_LABEL` in every position but ``bounded`` (a
    label whose values an enum bounds, kept as it is). The hot path is the caller's
    ``index.get(key)``; :meth:`add` is the miss."""

    __slots__ = ("bounded", "index", "max_sets", "num_overflow_records")

    def __init__(self, max_sets: int, *, bounded: int) -> None:
        if max_sets < 1:
            raise ValueError(f"max_label_sets must be >= 1, got {max_sets}")
        self.max_sets = max_sets
        self.bounded = bounded
        self.index: dict[tuple[str, ...], int] = {}
        self.num_overflow_records = 0

    def __len__(self) -> int:
        return len(self.index)

    def add(self, key: tuple[str, ...]) -> int:
        """The group of a tuple not in :attr:`index` yet (a new one, or the overflow's)."""
        if len(self.index) >= self.max_sets:
            self.num_overflow_records += 1
            key = tuple(v if k == self.bounded else OVERFLOW_LABEL for k, v in enumerate(key))
        return self.index.setdefault(key, len(self.index))


def _bucket_layout(buckets: Sequence[float]) -> tuple[tuple[float, ...], F64, list[str]]:
    """Validated bucket bounds, as an array, and as ``le`` label values with ``+Inf``."""
    checked = validate_buckets(list(buckets))
    return checked, np.asarray(checked, dtype=np.float64), [*map(_go_float, checked), "+Inf"]


class PrometheusExporter(FoldingSink, Collector):
    """Latency histograms and request/token counters of the records it receives.

    ``max_label_sets`` bounds the label sets (a client-chosen model name must not grow the
    series without bound): further sets are counted under ``model="__overflow__"``.
    ``export`` never raises; a record that breaks the contract is left out, logged once and
    counted in :attr:`num_invalid_records`.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        buckets: Sequence[float] = LATENCY_BUCKETS_S,
        slo_label: bool = False,
        max_label_sets: int = 1000,
        fold_every: int = 1024,
    ) -> None:
        # Vantage (position 1) is bounded by the enum; the other labels fold into one value.
        self._sets = LabelSets(max_label_sets, bounded=1)
        self.buckets, self._bounds, self._le = _bucket_layout(buckets)
        self.slo_label = slo_label
        self.label_names = ("model", "vantage", "slo") if slo_label else ("model", "vantage")
        self.max_label_sets = max_label_sets
        # Its lock guards everything below.
        self._folder = RecordFolder(
            self._add, destination="Prometheus metrics", logger=logger, fold_every=fold_every
        )
        width = len(self.buckets) + 1
        self._counts = [np.zeros((0, width), dtype=np.int64) for _ in _HISTOGRAMS]
        self._sums = [np.zeros(0, dtype=np.float64) for _ in _HISTOGRAMS]
        self._requests = np.zeros((0, len(_STATUSES)), dtype=np.int64)
        self._output_tokens = np.zeros(0, dtype=np.int64)
        self._prompt_tokens = np.zeros(0, dtype=np.int64)
        registry.register(self)

    @property
    def num_overflow_records(self) -> int:
        """Records counted under the overflow label set (past ``max_label_sets``)."""
        return self._sets.num_overflow_records

    # -- Collector --

    def describe(self) -> Iterator[Metric]:
        for name, doc in _HISTOGRAMS:
            yield HistogramMetricFamily(name, doc, labels=self.label_names)
        yield from self._counter_families()

    def collect(self) -> Iterator[Metric]:
        self._folder.fold()
        with self._folder.lock:  # build under the lock, yield after it
            families = self._families()
        yield from families

    def _families(self) -> list[Metric]:
        keys = list(self._sets.index)
        families: list[Metric] = []
        for (name, doc), counts, sums in zip(_HISTOGRAMS, self._counts, self._sums, strict=True):
            histogram = HistogramMetricFamily(name, doc, labels=self.label_names)
            cumulative = np.cumsum(counts, axis=1).tolist()
            for g, key in enumerate(keys):
                histogram.add_metric(
                    list(key),
                    buckets=list(zip(self._le, cumulative[g], strict=True)),
                    sum_value=float(sums[g]),
                )
            families.append(histogram)
        requests, output, prompt = self._counter_families()
        rows = self._requests.tolist()
        for g, key in enumerate(keys):
            for s, status in enumerate(_STATUSES):
                requests.add_metric([*key, status.name.lower()], rows[g][s])
            output.add_metric(list(key), int(self._output_tokens[g]))
            prompt.add_metric(list(key), int(self._prompt_tokens[g]))
        return [*families, requests, output, prompt]

    def _counter_families(self) -> tuple[CounterMetricFamily, ...]:
        labels = self.label_names
        return (
            CounterMetricFamily(
                "goodput_requests", "Finished requests by status.", labels=(*labels, "status")
            ),
            CounterMetricFamily(
                "goodput_output_tokens", "Output tokens of finished requests.", labels=labels
            ),
            CounterMetricFamily(
                "goodput_prompt_tokens", "Prompt tokens of finished requests.", labels=labels
            ),
        )

    # -- folding (under the folder's lock) --

    def _add(self, batch: RecordBatch) -> None:
        groups = self._group_rows(batch)
        num_groups = len(self._sets)
        self._grow(num_groups)
        lat = request_latencies(batch, validate=False)
        ok = batch.status == Status.OK
        for h, values in enumerate((lat.ttft_s, lat.tpot_s, lat.e2el_s)):
            rows = ok & ~np.isnan(values)
            self._observe(h, values[rows], groups[rows], num_groups)
        gaps_s, gap_rows = itl_gaps_s(batch, validate=False)
        keep = ok[gap_rows]
        self._observe(3, gaps_s[keep], groups[gap_rows[keep]], num_groups)

        status_index = np.searchsorted(np.array(_STATUSES), batch.status)
        final_status = np.isin(batch.status, np.array(_STATUSES))
        flat = groups[final_status] * len(_STATUSES) + status_index[final_status]
        self._requests += np.bincount(flat, minlength=self._requests.size).reshape(
            self._requests.shape
        )
        self._output_tokens += _sum_by_group(lat.output_tokens, groups, num_groups)
        self._prompt_tokens += _sum_by_group(batch.prompt_tokens, groups, num_groups)

    def _observe(self, h: int, values: F64, groups: I64, num_groups: int) -> None:
        if values.shape[0] == 0:
            return
        self._counts[h] += bucket_counts(values, groups, num_groups, self._bounds)
        self._sums[h] += np.bincount(groups, weights=values, minlength=num_groups)

    def _group_rows(self, batch: RecordBatch) -> I64:
        """The label-set index of every row (per request: one dict lookup each)."""
        models = batch.labels["model"].decode()
        slos = batch.labels["slo"].decode() if self.slo_label else None
        vantages = [Vantage(v).name.lower() for v in range(len(Vantage))]
        index = self._sets.index
        out = np.empty(len(batch), dtype=np.int64)
        for i, vantage in enumerate(batch.vantage.tolist()):
            key: tuple[str, ...] = (models[i], vantages[vantage])
            if slos is not None:
                key = (*key, slos[i])
            g = index.get(key)
            out[i] = g if g is not None else self._sets.add(key)
        return out

    def _grow(self, num_groups: int) -> None:
        have = self._requests.shape[0]
        if num_groups == have:
            return
        extra = num_groups - have
        self._counts = [np.pad(c, ((0, extra), (0, 0))) for c in self._counts]
        self._sums = [np.pad(s, (0, extra)) for s in self._sums]
        self._requests = np.pad(self._requests, ((0, extra), (0, 0)))
        self._output_tokens = np.pad(self._output_tokens, (0, extra))
        self._prompt_tokens = np.pad(self._prompt_tokens, (0, extra))


def _sum_by_group(values: npt.NDArray[np.integer], groups: I64, num_groups: int) -> I64:
    # Integer sums stay exact (a float bincount would round past 2**53).
    out = np.zeros(num_groups, dtype=np.int64)
    np.add.at(out, groups, values.astype(np.int64, copy=False))
    return out


#: Buckets (seconds) of ``goodput_kv_transfer_seconds``: an 8k-token Llama-3.1-8B prompt
#: (1 GiB) crosses NVLink in about 5 ms and a 400 Gb/s NIC in about 30 ms.
KV_TRANSFER_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
_KV_LABELS = ("model", "vantage")


class KVTransferExporter(FoldingSink, Collector):
    """KV-cache bytes and hand-off times of the records it receives (module docstring).

    Only records with ``kv_bytes > 0`` or both hand-off phases make a label set, so an
    instance that never receives a KV cache exports the families without series.
    ``max_label_sets`` bounds the ``model`` values as :class:`PrometheusExporter` does.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        buckets: Sequence[float] = KV_TRANSFER_BUCKETS_S,
        max_label_sets: int = 100,
        fold_every: int = 1024,
    ) -> None:
        self._sets = LabelSets(max_label_sets, bounded=1)  # (model, vantage), as above
        self.buckets, self._bounds, self._le = _bucket_layout(buckets)
        self.max_label_sets = max_label_sets
        self._folder = RecordFolder(
            self._add, destination="KV transfer metrics", logger=logger, fold_every=fold_every
        )
        self._bytes = np.zeros(0, dtype=np.int64)
        self._counts = np.zeros((0, len(self.buckets) + 1), dtype=np.int64)
        self._sums = np.zeros(0, dtype=np.float64)
        registry.register(self)

    @property
    def num_overflow_records(self) -> int:
        """Records counted under the overflow label set (past ``max_label_sets``)."""
        return self._sets.num_overflow_records

    def describe(self) -> Iterator[Metric]:
        return iter(self._empty())

    def collect(self) -> Iterator[Metric]:
        self._folder.fold()
        with self._folder.lock:
            total, seconds = self._empty()
            cumulative = np.cumsum(self._counts, axis=1).tolist()
            for g, key in enumerate(self._sets.index):
                total.add_metric(list(key), int(self._bytes[g]))
                seconds.add_metric(
                    list(key),
                    buckets=list(zip(self._le, cumulative[g], strict=True)),
                    sum_value=float(self._sums[g]),
                )
        yield from (total, seconds)

    @staticmethod
    def _empty() -> tuple[CounterMetricFamily, HistogramMetricFamily]:
        return (
            CounterMetricFamily(
                "goodput_kv_transfer_bytes",
                "KV-cache bytes received from another instance (the PD hand-off).",
                labels=_KV_LABELS,
            ),
            HistogramMetricFamily(
                "goodput_kv_transfer_seconds",
                "KV hand-off time: from its start until the prompt's KV cache is in place.",
                labels=_KV_LABELS,
            ),
        )

    def _add(self, batch: RecordBatch) -> None:
        start = batch.phase_offsets_us[:, Phase.KV_HANDOFF_START]
        end = batch.phase_offsets_us[:, Phase.KV_HANDOFF_END]
        timed = (start >= 0) & (end >= start)
        rows = np.flatnonzero(timed | (batch.kv_bytes > 0))
        if rows.shape[0] == 0:
            return
        models = batch.labels["model"].decode()
        vantages = batch.vantage.tolist()
        index = self._sets.index
        groups = np.empty(rows.shape[0], dtype=np.int64)
        for j, i in enumerate(rows.tolist()):
            key = (models[i], Vantage(vantages[i]).name.lower())
            g = index.get(key)
            groups[j] = g if g is not None else self._sets.add(key)
        extra = len(self._sets) - self._bytes.shape[0]
        if extra:
            self._bytes = np.pad(self._bytes, (0, extra))
            self._counts = np.pad(self._counts, ((0, extra), (0, 0)))
            self._sums = np.pad(self._sums, (0, extra))
        num_groups = len(self._sets)
        self._bytes += _sum_by_group(batch.kv_bytes[rows], groups, num_groups)
        keep = timed[rows]
        if keep.any():
            seconds = (end[rows][keep] - start[rows][keep]).astype(np.float64) / 1e6
            self._counts += bucket_counts(seconds, groups[keep], num_groups, self._bounds)
            self._sums += np.bincount(groups[keep], weights=seconds, minlength=num_groups)
