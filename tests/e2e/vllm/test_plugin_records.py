"""The stat-logger plugin inside the real vLLM server delivers engine records to the real
control plane, with timings consistent with what the client saw."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from exporters.records import Phase, Status, TokenDetail, Vantage

from .conftest import ControlPlane, PDPair, metrics_text, token_prompt

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def _stream(
    url: str, prompt: list[int], max_tokens: int, request_id: str
) -> tuple[float, float, float, int]:
    """Stream a completion; (sent, first chunk, last chunk) wall-clock times and tokens."""
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = last = 0.0
    tokens = 0
    sent = time.time()
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers={"X-Request-Id": request_id}, timeout=60
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["text"]:
                now = time.time()
                first = first or now
                last = now
    return sent, first, last, tokens


def test_engine_record_matches_the_request(pd_pair: PDPair, control_plane: ControlPlane) -> None:
    sent, first, last, tokens = _stream(
        pd_pair.decode.url, token_prompt(200, seed=200), 16, "plugin-200"
    )
    done = time.time()
    assert tokens == 16

    (record,) = control_plane.wait_for_records(
        lambda found: len(found) == 1, vantage=Vantage.ENGINE, request_id="plugin-200"
    )

    assert record.token_detail is TokenDetail.SUMMARY
    assert record.status is Status.OK and record.reason == "length"
    assert record.labels.model == "tiny"
    assert record.prompt_tokens == 200
    assert record.output_tokens == 16
    assert record.tokens_per_emission().tolist() == [1, 15]
    ttft_us, e2e_us = record.emission_offsets_us.tolist()
    arrival_s = record.arrival_time_ns / 1e9
    # One clock (this host's wall clock): the engine saw the request after the client sent
    # it, produced the first token before the client read it, finished before the end.
    assert sent <= arrival_s
    assert arrival_s + ttft_us / 1e6 <= first
    assert arrival_s + e2e_us / 1e6 <= done
    assert 0 < ttft_us <= e2e_us
    assert e2e_us / 1e6 <= last - sent
    phases = record.phase_offsets_us
    order = [Phase.QUEUED, Phase.PREFILL_START, Phase.PREFILL_END, Phase.FINISHED]
    values = [int(phases[p]) for p in order]
    assert min(values) >= 0
    assert values == sorted(values)
    assert values[2] == ttft_us and values[3] == e2e_us
    assert phases[Phase.KV_HANDOFF_START] == phases[Phase.KV_HANDOFF_END] == -1


def test_plugin_metrics_on_vllm_metrics(pd_pair: PDPair) -> None:
    text = metrics_text(pd_pair.prefill.url)

    assert 'goodput_engine_records_total{engine="0",model="tiny"}' in text
    assert "goodput_engine_kv_cache_usage_ratio" in text
    assert "goodput_exporter_" in text
