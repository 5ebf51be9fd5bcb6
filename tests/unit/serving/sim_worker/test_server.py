"""The sim worker's HTTP server on loopback: formats, errors, metrics, KV hand-off, timing."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn

from exporters.fleet import PoolRole
from serving.gateway.sse import EventSplitter, StreamAccounting
from serving.sim import LatencyModel, get_link
from serving.sim.worker.cli import SimWorkerSpec, build_worker
from serving.sim.worker.prompts import word_prompt
from serving.sim.worker.server import create_app
from serving.workers.load import metric_sum, parse_load

pytestmark = pytest.mark.integration

LATENCY = LatencyModel.for_profile("h100-llama3.1-8b")
MODEL = "llama-3.1-8b"
VLLM_NAMES = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:prompt_tokens_by_source_total", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total", "vllm:num_preemptions_total",
    "vllm:request_success_total", "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
    "goodput_sim_step_lag_seconds_bucket",
)  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Worker:
    url: str
    client: httpx.Client

    def metrics(self) -> str:
        return self.client.get("/metrics").text


@pytest.fixture
def start_worker() -> Iterator[Any]:
    servers: list[tuple[uvicorn.Server, threading.Thread, httpx.Client]] = []

    def start(sim_config: str = "jitter=0", kv_dir: Path | None = None, **kw: Any) -> Worker:
        port = free_port()
        spec = SimWorkerSpec(port=port, sim_config=sim_config, kv_dir=kv_dir, **kw)
        engine, settings, handoff, control = build_worker(spec)
        app = create_app(engine, settings, handoff, control)
        server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "the sim worker did not start"
            time.sleep(0.02)
        client = httpx.Client(base_url=spec.url, timeout=30)
        servers.append((server, thread, client))
        return Worker(spec.url, client)

    yield start
    for server, thread, client in servers:
        client.close()
        server.should_exit = True
        thread.join(10)


def stream(
    worker: Worker, path: str, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[float], StreamAccounting]:
    """The data chunks of a stream, their arrival times, and the gateway's accounting."""
    chunks: list[dict[str, Any]] = []
    times: list[float] = []
    acct = StreamAccounting(client_usage=True, client_continuous=True)
    splitter = EventSplitter()
    with worker.client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for data in response.iter_raw():
            for event in splitter.feed(data):
                acct.process(event)
                payload = event[5:].strip()
                if payload != b"[DONE]":
                    chunks.append(json.loads(payload))
                    times.append(time.perf_counter())
    assert acct.done
    return chunks, times, acct


def test_models_health_and_a_plain_completion(start_worker: Any) -> None:
    worker = start_worker()
    assert worker.client.get("/health").status_code == 200
    card = worker.client.get("/v1/models").json()["data"][0]
    assert (card["id"], card["max_model_len"], card["root"]) == (MODEL, 131072, "h100-llama3.1-8b")
    body = {"model": MODEL, "prompt": word_prompt(40, 1), "max_tokens": 7, "ignore_eos": True}
    answer = worker.client.post("/v1/completions", json=body).json()
    assert answer["object"] == "text_completion"
    assert answer["usage"]["prompt_tokens"] == 40 and answer["usage"]["completion_tokens"] == 7
    assert len(answer["choices"][0]["text"].split()) == 7
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["kv_transfer_params"] is None


def test_streams_in_vllms_format_with_usage_on_every_chunk(start_worker: Any) -> None:
    worker = start_worker()
    body = {
        "prompt": list(range(300)), "max_tokens": 12, "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip
    chunks, _, acct = stream(worker, "/v1/completions", body)
    assert acct.completion_tokens == 12 and acct.prompt_tokens == 300
    tokens, final = chunks[:-1], chunks[-1]
    assert [c["usage"]["completion_tokens"] for c in tokens] == list(range(1, 13))
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 11 + ["length"]
    assert final["choices"] == [] and final["usage"]["total_tokens"] == 312
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)


def test_chat_streams_a_role_chunk_then_content_and_no_usage_unasked(start_worker: Any) -> None:
    worker = start_worker()
    body = {"messages": [{"role": "user", "content": "say something"}], "max_tokens": 4}
    chunks, _, acct = stream(worker, "/v1/chat/completions", body)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("usage" not in c for c in chunks)
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:]]
    assert len(contents) == 4 and all(contents)
    assert chunks[-1]["object"] == "chat.completion.chunk"
    assert acct.completion_tokens == 4  # counted one per content chunk without usage


@pytest.mark.parametrize(
    ("body", "status", "param", "message"),
    [
        ({"prompt": "a", "max_tokens": 0}, 400, "max_tokens", "expected an integer >= 1"),
        ({"prompt": "a", "n": 2}, 400, "n", "only 1 completion"),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options",
         "only allowed when stream is true"),
        ({"prompt": "a", "kv_transfer_params": [1]}, 400, "kv_transfer_params",
         "expected an object"),
        ({"prompt": "a", "model": "gpt-4"}, 404, "model", "allowed: ['llama-3.1-8b']"),
        ({"prompt": "a", "max_tokens": 200}, 400, "max_tokens", "maximum context length is 100"),
        ({"prompt": {"x": 1}}, 400, "prompt", "expected one prompt"),
        ({"prompt": "a", "ignore_eos": "yes"}, 400, "ignore_eos", "expected true or false"),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(
    start_worker: Any, body: dict[str, Any], status: int, param: str, message: str
) -> None:
    worker = start_worker(max_model_len=100)
    response = worker.client.post("/v1/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error


def test_metrics_carry_vllms_names_and_the_load(start_worker: Any) -> None:
    worker = start_worker("jitter=0,max_seqs=1")
    body = {"prompt": word_prompt(20, 3), "max_tokens": 200, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(base_url=worker.url) as other,
        worker.client.stream("POST", "/v1/completions", json=body) as first,
    ):
        chunks = first.iter_raw()
        next(chunks)  # running for 1.7 s
        second_body = body | {"prompt": "b c", "max_tokens": 60}
        with other.stream("POST", "/v1/completions", json=second_body) as second:
            assert second.status_code == 200
            load = parse_load(worker.metrics())
            assert (load.num_requests_running, load.num_requests_waiting) == (1, 1)
            assert 0 < load.kv_cache_usage_ratio < 0.01
            second.read()  # both streams to the end: every token is counted
        b"".join(chunks)
    text = worker.metrics()
    for name in VLLM_NAMES:
        assert f"\n{name}{{" in text, name
    assert metric_sum(text, "vllm:generation_tokens_total") == 260
    assert metric_sum(text, "vllm:prompt_tokens_by_source_total", source="local_compute") == 23
    assert metric_sum(text, "vllm:request_success_total", finished_reason="length") == 2
    assert metric_sum(text, "vllm:inter_token_latency_seconds_count") == 258


def test_kv_transfer_params_hand_the_prompt_from_prefill_to_decode(start_worker: Any) -> None:
    prefill, decode = start_worker(), start_worker()
    prompt = word_prompt(2000, 9)
    first = prefill.client.post(
        "/v1/completions",
        json={"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}},
    ).json()
    params = first["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_port"] == int(prefill.url.rsplit(":", 1)[1])
    assert len(params["remote_block_ids"]) == 2000 // 16
    start = time.perf_counter()
    leg = {"prompt": prompt, "max_tokens": 5, "ignore_eos": True, "kv_transfer_params": params}
    leg["stream_options"] = {"include_usage": True}
    _, times, acct = stream(decode, "/v1/completions", leg)
    ttft = times[0] - start
    nvlink = get_link("nvlink")
    modelled = nvlink.setup_s + 2000 * LATENCY.kv_bytes_per_token_per_gpu / nvlink.bytes_per_s
    modelled += LATENCY.decode_step_s(1, 2000)
    assert ttft >= modelled * 0.99  # never early
    assert modelled < LATENCY.prefill_s([2000])  # and the hand-off beats computing it here
    assert acct.completion_tokens == 5 and acct.cached_tokens == 2000
    text = decode.metrics()
    assert (
        metric_sum(text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
        == 2000
    )
    assert metric_sum(text, "vllm:external_prefix_cache_hits_total") == 2000
    assert metric_sum(text, "vllm:prompt_tokens_by_source_total", source="local_compute") == 0


def test_the_shared_folder_hands_over_one_prefill_to_one_decode(
    start_worker: Any, tmp_path: Path
) -> None:
    prefill, decode = start_worker(kv_dir=tmp_path), start_worker(kv_dir=tmp_path)
    body = {"prompt": word_prompt(700, 4), "max_tokens": 1}
    assert prefill.client.post("/v1/completions", json=body).status_code == 200
    assert len(list(tmp_path.glob("*.simkv"))) == 1
    decoded = decode.client.post("/v1/completions", json=body | {"max_tokens": 6}).json()
    assert decoded["usage"]["prompt_tokens_details"]["cached_tokens"] == 700
    assert not list(tmp_path.glob("*.simkv"))  # taken: one decode leg per prefill
    again = decode.client.post("/v1/completions", json=body | {"max_tokens": 6}).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # computed here
    text = decode.metrics()
    assert metric_sum(text, "vllm:external_prefix_cache_queries_total") == 1400
    assert metric_sum(text, "vllm:external_prefix_cache_hits_total") == 700
    # A one-token client request: its decode leg (max_tokens 1 too) loads the KV as well.
    one = {"prompt": word_prompt(300, 5), "max_tokens": 1}
    prefill.client.post("/v1/completions", json=one)
    decoded = decode.client.post("/v1/completions", json=one).json()
    assert decoded["usage"]["prompt_tokens_details"]["cached_tokens"] == 300
    assert not list(tmp_path.glob("*.simkv"))


def test_inter_token_gaps_follow_the_modelled_decode_step(start_worker: Any) -> None:
    worker = start_worker()
    body = {"prompt": list(range(1000)), "max_tokens": 60, "ignore_eos": True}
    _, times, _ = stream(worker, "/v1/completions", body)
    gaps = np.diff(times)
    modelled = np.array([LATENCY.decode_step_s(1, 1000 + k) for k in range(59)])
    # Per-gap wall jitter on a shared machine is large, the sum is not: the total matches
    # within 10 %, the median gap within 20 %.
    assert abs(gaps.sum() / modelled.sum() - 1) < 0.10, (gaps.sum(), modelled.sum())
    assert abs(np.median(gaps) / np.median(modelled) - 1) < 0.20


def test_a_client_that_goes_away_aborts_its_request(start_worker: Any) -> None:
    worker = start_worker()
    body = {"prompt": "a b", "max_tokens": 5000, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(base_url=worker.url) as client,
        client.stream("POST", "/v1/completions", json=body) as response,
    ):
        next(response.iter_raw())
    deadline = time.monotonic() + 10
    while metric_sum(worker.metrics(), "vllm:request_success_total", finished_reason="abort") < 1:
        assert time.monotonic() < deadline, "the abort was never counted"
        time.sleep(0.05)
    assert metric_sum(worker.metrics(), "vllm:num_requests_running") == 0
    assert metric_sum(worker.metrics(), "vllm:generation_tokens_total") < 5000


def test_role_of_the_worker_is_in_its_info(start_worker: Any) -> None:
    worker = start_worker(role=PoolRole.DECODE)
    info = worker.client.get("/sim").json()
    assert (info["role"], info["state"], info["strategy"], info["link"]) == (
        "decode", "ready", "chunked", "nvlink",
    )  # fmt: skip
