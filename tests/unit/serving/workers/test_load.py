"""Worker load from a vLLM /metrics scrape."""

from __future__ import annotations

from serving.workers import WorkerLoad, metric_sum, parse_load

SCRAPE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 6.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.5
# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_compute"} 900.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="external_kv_transfer"} 256.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="tiny",source="external_kv_transfer"} 128.0
"""


def test_load_sums_requests_over_engines_and_keeps_the_highest_kv_usage() -> None:
    load = parse_load(SCRAPE)

    assert load == WorkerLoad(
        num_requests_running=3, num_requests_waiting=6, kv_cache_usage_ratio=0.5
    )
    assert not load.idle
    assert load.as_report() == {
        "num_requests_running": 3,
        "num_requests_waiting": 6,
        "kv_cache_usage_ratio": 0.5,
    }


def test_missing_series_read_as_an_idle_worker() -> None:
    load = parse_load("# nothing here\n")

    assert load == WorkerLoad()
    assert load.idle


def test_metric_sum_filters_on_labels() -> None:
    name = "vllm:prompt_tokens_by_source_total"

    assert metric_sum(SCRAPE, name, source="external_kv_transfer") == 384.0
    assert metric_sum(SCRAPE, name, source="external_kv_transfer", engine="1") == 128.0
    assert metric_sum(SCRAPE, name) == 1284.0
    assert metric_sum(SCRAPE, "vllm:absent_total") == 0.0
