"""``/metrics`` of a sim worker: vLLM's metric names, read from the engine at scrape time.

The names are vLLM V1's (what the worker agent, the gateway's tests and dashboards read),
each labelled ``model_name`` and ``engine="0"`` as vLLM labels them:

* gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (queued, preempted,
  and waiting for a transferred KV cache), ``vllm:kv_cache_usage_perc`` (a 0..1 ratio:
  blocks held by requests or by cached prefixes that are still read, over all blocks);
* counters ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
  ``vllm:prompt_tokens_by_source_total{source=local_compute|local_cache_hit|
  external_kv_transfer}``, ``vllm:prefix_cache_queries_total`` / ``_hits_total``,
  ``vllm:external_prefix_cache_queries_total`` / ``_hits_total`` (tokens),
  ``vllm:num_preemptions_total``, ``vllm:request_success_total{finished_reason}``;
* histograms ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds``,
  ``vllm:e2e_request_latency_seconds`` (virtual = wall seconds of the modelled schedule);
* the sim worker's own ``goodput_sim_step_lag_seconds``: per iteration, how long after its
  modelled end the loop committed it (and released its tokens).

The collector reads plain attributes of the engine, so scrape it on the engine's loop.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from serving.sim.worker.engine import Histogram, SimEngine

__all__ = ["EngineCollector", "metrics_text"]

_LABELS = ("model_name", "engine")


class EngineCollector(Collector):
    """Prometheus families of one :class:`SimEngine` (see the module docstring)."""

    def __init__(self, engine: SimEngine, model_name: str) -> None:
        self.engine = engine
        self.values = (model_name, "0")

    def collect(self) -> Iterator[Metric]:
        engine, v = self.engine, list(self.values)
        c, load = engine.counters, engine.load

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=_LABELS)
            family.add_metric(v, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=_LABELS)
            family.add_metric(v, value)
            return family

        yield gauge("vllm:num_requests_running", "Requests in the running batch.",
                    load.num_requests_running)  # fmt: skip
        yield gauge("vllm:num_requests_waiting", "Requests queued or loading their KV.",
                    load.num_requests_waiting)  # fmt: skip
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = full).",
                    load.kv_cache_usage_ratio)  # fmt: skip
        yield counter("vllm:prompt_tokens", "Prompt tokens processed.", c.prompt_tokens)
        yield counter("vllm:generation_tokens", "Tokens generated.", c.generation_tokens)
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source", "Prompt tokens by where their KV came from.",
            labels=(*_LABELS, "source"),
        )  # fmt: skip
        for source, value in (
            ("local_compute", c.local_compute_tokens),
            ("local_cache_hit", c.local_cache_hit_tokens),
            ("external_kv_transfer", c.external_kv_tokens),
        ):
            by_source.add_metric([*v, source], value)
        yield by_source
        yield counter("vllm:prefix_cache_queries", "Prefix-cache queried tokens.",
                      c.prefix_queries)  # fmt: skip
        yield counter("vllm:prefix_cache_hits", "Prefix-cache hit tokens.", c.prefix_hits)
        yield counter("vllm:external_prefix_cache_queries",
                      "Tokens looked up on another worker (KV connector).",
                      c.external_queries)  # fmt: skip
        yield counter("vllm:external_prefix_cache_hits",
                      "Tokens whose KV came from another worker.", c.external_hits)  # fmt: skip
        yield counter("vllm:num_preemptions", "Preemptions (recompute).", c.preemptions)
        success = CounterMetricFamily(
            "vllm:request_success", "Finished requests by finish reason.",
            labels=(*_LABELS, "finished_reason"),
        )  # fmt: skip
        for reason in ("stop", "length", "abort"):
            success.add_metric([*v, reason], c.finished.get(reason, 0))
        yield success
        yield _histogram("vllm:time_to_first_token_seconds", "Time to first token.", v, c.ttft)
        yield _histogram("vllm:inter_token_latency_seconds", "Inter-token latency.", v, c.itl)
        yield _histogram("vllm:e2e_request_latency_seconds", "End-to-end latency.", v, c.e2e)
        yield _histogram(
            "goodput_sim_step_lag_seconds",
            "How late the worker committed each iteration after its modelled end: the "
            "tokens' delay beyond the model (a CPU-starved worker shows it here).",
            v,
            c.step_lag,
        )


def _histogram(name: str, doc: str, values: list[str], h: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=_LABELS)
    cumulative = h.counts.cumsum().tolist()
    buckets = [(f"{b:g}", float(n)) for b, n in zip(h.bounds, cumulative, strict=True)]
    buckets.append(("+Inf", float(h.count)))
    family.add_metric(values, buckets, h.total)
    return family


def metrics_text(engine: SimEngine, model_name: str) -> bytes:
    """The Prometheus text exposition of ``engine``'s metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name))
    return generate_latest(registry)
