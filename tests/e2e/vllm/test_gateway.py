"""The gateway in front of the real PD pair: tokens come back, the decode instance loads the
prompt's KV cache from the prefill instance, and the control plane holds the gateway's and
the engines' records of each request with consistent timings."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporters.latency import request_latencies
from exporters.records import Phase, RecordBatch, RequestRecord, Status, Vantage
from serving.gateway.process import GatewayProcess
from serving.model import kv_bytes_per_token
from serving.workers import metric_sum

from .conftest import ControlPlane, PDPair, metrics_text, token_prompt

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

_KV_TOKENS = re.compile(
    r'^vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\} (\S+)$',
    re.MULTILINE,
)


def start_gateway(args: list[str], control_plane: ControlPlane, log_path: Path) -> GatewayProcess:
    gateway = GatewayProcess(
        [*args, "--control-plane", control_plane.url,
         "--agent-key", control_plane.keys["agent"],
         "--ingest-key", control_plane.keys["ingest"],
         "--viewer-key", control_plane.keys["viewer"],
         "--fleet-refresh", "1", "--log-level", "WARNING"],
        log_path=log_path,
    )  # fmt: skip
    gateway.start()
    gateway.wait_ready(60)
    return gateway


@pytest.fixture(scope="module")
def gateway(
    pd_pair: PDPair, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    gw = start_gateway(
        ["--prefill", pd_pair.prefill.url, "--decode", pd_pair.decode.url,
         "--gateway-id", "e2e-gateway"],
        control_plane,
        tmp_path_factory.mktemp("gateway") / "gateway.log",
    )  # fmt: skip
    try:
        yield gw
    finally:
        gw.stop()


def stream(url: str, prompt: list[int], max_tokens: int, request_id: str) -> list[dict]:
    """The parsed SSE events of one streamed completion."""
    body = {
        "model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers={"x-request-id": request_id},
        timeout=120,
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        assert response.headers["x-request-id"] == request_id
        text = response.read().decode()
    return [json.loads(e[6:]) if e != "data: [DONE]" else "[DONE]"
            for e in text.split("\n\n") if e]  # fmt: skip


def kv_transfer_tokens(url: str) -> float:
    return sum(float(v) for v in _KV_TOKENS.findall(metrics_text(url)))


def test_a_request_through_the_gateway_returns_its_tokens(gateway: GatewayProcess) -> None:
    events = stream(gateway.url, token_prompt(300, seed=3001), 12, "gw-tokens")
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    assert 1 <= len(chunks) <= 12 and all("usage" not in c for c in chunks)
    answer = httpx.post(
        f"{gateway.url}/v1/completions",
        json={"model": "tiny", "prompt": token_prompt(150, seed=3002), "max_tokens": 5,
              "ignore_eos": True},
        timeout=120,
    ).json()  # fmt: skip
    assert answer["usage"]["completion_tokens"] == 5
    models = httpx.get(f"{gateway.url}/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "tiny"


_TINY_KV_BYTES_PER_TOKEN = kv_bytes_per_token(
    {"num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64, "hidden_size": 256,
     "num_hidden_layers": 2}
)  # fmt: skip


def kv_families(url: str, prefix: str) -> tuple[float, float, float]:
    """(observations, seconds, bytes) of ``goodput_kv_<prefix>_*`` on an engine's /metrics."""
    text = metrics_text(url)
    labels = {"model": "tiny", "vantage": "engine"}
    return (
        metric_sum(text, f"goodput_kv_{prefix}_seconds_count", **labels),
        metric_sum(text, f"goodput_kv_{prefix}_seconds_sum", **labels),
        metric_sum(text, f"goodput_kv_{prefix}_bytes_total", **labels),
    )


def test_the_decode_instance_gets_the_prompt_by_kv_transfer(
    gateway: GatewayProcess, pd_pair: PDPair
) -> None:
    before = kv_transfer_tokens(pd_pair.decode.url)
    loads_before = kv_families(pd_pair.decode.url, "transfer")
    saves_before = kv_families(pd_pair.prefill.url, "save")
    prefill_loads_before = kv_families(pd_pair.prefill.url, "transfer")
    decode_saves_before = kv_families(pd_pair.decode.url, "save")
    stream(gateway.url, token_prompt(400, seed=3003), 4, "gw-kv")
    # A 400-token prompt transfers its whole 128-token blocks but the last token's: 384.
    deadline = time.monotonic() + 10
    while kv_transfer_tokens(pd_pair.decode.url) - before < 384:
        assert time.monotonic() < deadline, "the decode instance loaded no KV from the prefill"
        time.sleep(0.2)
    assert kv_transfer_tokens(pd_pair.decode.url) - before == 384
    # The connector's transfer stats on vLLM's /metrics (the plugin's goodput_kv_* families):
    # the decode instance loaded one prompt of 384 tokens, the prefill instance saved it.
    expected_bytes = 384 * _TINY_KV_BYTES_PER_TOKEN
    while kv_families(pd_pair.decode.url, "transfer")[0] - loads_before[0] < 1:
        assert time.monotonic() < deadline, "no goodput_kv_transfer_seconds on the decode"
        time.sleep(0.2)
    loads = np.subtract(kv_families(pd_pair.decode.url, "transfer"), loads_before)
    saves = np.subtract(kv_families(pd_pair.prefill.url, "save"), saves_before)
    print(f"\nKV load on the decode: {loads}; KV save on the prefill: {saves}")
    assert loads[0] == 1 and 0 < loads[1] < 5 and loads[2] == expected_bytes
    assert saves[0] == 1 and 0 < saves[1] < 5 and saves[2] == expected_bytes
    # Neither side did the other's half of the hand-off.
    assert kv_families(pd_pair.prefill.url, "transfer") == prefill_loads_before
    assert kv_families(pd_pair.decode.url, "save") == decode_saves_before


def _latencies(record: RequestRecord) -> tuple[float, float]:
    lat = request_latencies(RecordBatch.from_records([record]))
    return float(lat.ttft_s[0]), float(lat.e2el_s[0])


def test_control_plane_holds_gateway_and_engine_records_that_agree(
    gateway: GatewayProcess, control_plane: ControlPlane
) -> None:
    stream(gateway.url, token_prompt(300, seed=3004), 16, "gw-join")
    (gw,) = control_plane.wait_for_records(
        lambda found: len(found) == 1, vantage=Vantage.GATEWAY, request_id="gw-join"
    )
    (engine,) = control_plane.wait_for_records(
        lambda found: len(found) == 1, vantage=Vantage.ENGINE, request_id="gw-join"
    )
    (prefill,) = control_plane.wait_for_records(
        lambda found: len(found) == 1, vantage=Vantage.ENGINE, request_id="gw-join-prefill"
    )
    assert gw.status == engine.status == Status.OK
    assert gw.output_tokens == engine.output_tokens == 16
    assert prefill.output_tokens == 1
    assert gw.prompt_tokens == engine.prompt_tokens == 300
    assert (gw.labels.model, gw.labels.route) == ("tiny", "pd")
    # The gateway's phases: prefill, then the KV handoff, then tokens.
    phases = gw.phase_offsets_us
    order = [Phase.PREFILL_START, Phase.PREFILL_END, Phase.KV_HANDOFF_START,
             Phase.KV_HANDOFF_END]  # fmt: skip
    assert (phases[order] >= 0).all() and (np.diff(phases[order]) >= 0).all()
    assert phases[Phase.KV_HANDOFF_END] <= gw.emission_offsets_us[0]
    # The decode engine saw the request later and shorter than the client-side gateway:
    # it arrived there after the prefill, and finished before the gateway relayed the end.
    gw_ttft, gw_e2el = _latencies(gw)
    engine_ttft, engine_e2el = _latencies(engine)
    assert 0 < engine_ttft <= gw_ttft
    assert 0 < engine_e2el <= gw_e2el
    slack_ns = 50_000_000  # wall clocks of two processes on one machine
    assert (
        engine.arrival_time_ns >= gw.arrival_time_ns + phases[Phase.PREFILL_END] * 1000 - slack_ns
    )
    gw_end = gw.arrival_time_ns + int(gw_e2el * 1e9)
    engine_end = engine.arrival_time_ns + int(engine_e2el * 1e9)
    assert engine_end <= gw_end + slack_ns
    # The prefill engine record lies inside the gateway's prefill phase.
    assert prefill.arrival_time_ns >= gw.arrival_time_ns - slack_ns
    assert (
        prefill.arrival_time_ns <= gw.arrival_time_ns + phases[Phase.PREFILL_END] * 1000 + slack_ns
    )


def test_gateway_metrics_and_fleet_registration(
    gateway: GatewayProcess, control_plane: ControlPlane
) -> None:
    stream(gateway.url, token_prompt(130, seed=3005), 3, "gw-metrics")
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    ok = (("model", "tiny"), ("slo", ""), ("status", "ok"), ("vantage", "gateway"))
    assert samples[("goodput_requests_total", ok)] >= 1
    decode_ok = (("outcome", "ok"), ("pool", "decode"))
    assert samples[("goodput_gateway_upstream_requests_total", decode_ok)] >= 1
    deadline = time.monotonic() + 20
    while not any(m["id"] == "e2e-gateway" for m in control_plane.fleet()):
        assert time.monotonic() < deadline, "the gateway never registered in the fleet"
        time.sleep(0.2)
    (member,) = [m for m in control_plane.fleet() if m["id"] == "e2e-gateway"]
    assert (member["kind"], member["state"]) == ("gateway", "ready")


def test_pools_learnt_from_the_fleet_registry(
    pd_pair: PDPair, control_plane: ControlPlane, tmp_path: Path
) -> None:
    gw = start_gateway(["--gateway-id", "e2e-fleet-gateway"], control_plane, tmp_path / "gw.log")
    try:
        deadline = time.monotonic() + 20
        while True:
            roles = {i["id"]: i["role"] for i in httpx.get(f"{gw.url}/health").json()["instances"]}
            if roles == {pd_pair.prefill.url: "prefill", pd_pair.decode.url: "decode"}:
                break
            assert time.monotonic() < deadline, f"pools never learnt from the fleet: {roles}"
            time.sleep(0.2)
        events = stream(gw.url, token_prompt(200, seed=3006), 3, "gw-fleet")
        assert events[-1] == "[DONE]"
    finally:
        gw.stop()
