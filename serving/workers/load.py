"""A worker's load, read from its vLLM server's Prometheus ``/metrics`` text.

vLLM exports ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and
``vllm:kv_cache_usage_perc`` (a 0..1 ratio despite its name) per engine; :func:`parse_load`
turns a scrape into a :class:`WorkerLoad` (sums over engines, the highest KV usage), which
the agent reports in its heartbeats. :func:`metric_sum` reads any sample, for example
``vllm:external_prefix_cache_hits_total`` (tokens that arrived by KV transfer).

Example::

    text = httpx.get(url + "/metrics").text
    load = parse_load(text)
    hits = metric_sum(text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["WorkerLoad", "metric_sum", "parse_load", "samples"]

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """Requests in the running batch and in the queue, and the KV cache's used fraction."""

    num_requests_running: int = 0
    num_requests_waiting: int = 0
    kv_cache_usage_ratio: float = 0.0

    @property
    def idle(self) -> bool:
        return self.num_requests_running == 0 and self.num_requests_waiting == 0

    def as_report(self) -> dict[str, int | float]:
        """The heartbeat ``load`` entries (flat, bounded keys)."""
        return {
            "num_requests_running": self.num_requests_running,
            "num_requests_waiting": self.num_requests_waiting,
            "kv_cache_usage_ratio": round(self.kv_cache_usage_ratio, 6),
        }


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition: ``(name, labels, value)``."""
    return [
        (sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 if none)."""
    return sum(
        value
        for sample_name, sample_labels, value in samples(text)
        if sample_name == name and all(sample_labels.get(k) == v for k, v in labels.items())
    )


def parse_load(text: str) -> WorkerLoad:
    """The load in a vLLM ``/metrics`` scrape (zeros for series it lacks)."""
    running = waiting = 0.0
    usage = 0.0
    for name, _, value in samples(text):
        if name == RUNNING:
            running += value
        elif name == WAITING:
            waiting += value
        elif name == KV_USAGE:
            usage = max(usage, value)
    return WorkerLoad(round(running), round(waiting), min(max(usage, 0.0), 1.0))
