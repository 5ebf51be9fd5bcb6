"""Real vLLM's ``--otlp-traces-endpoint`` spans reach the control plane's OTLP receivers.

One colocated vLLM worker behind a gateway, started once per OTLP protocol (the protocol is
per process): over HTTP/protobuf to ``POST /v1/traces``, then over gRPC to the OTLP/gRPC
receiver. Every request sent through the gateway becomes an OTLP record (the receiver's
counters say how many) joined to the gateway's record by the client's request id, and its
TTFT and E2EL are compared with what measured the same interval (docs/ingest.md, "Real
vLLM"):

* the stat-logger plugin's record of the same request (the same engine, the same arrival
  and first-token clocks): within :data:`SAME_INTERVAL_S`;
* the gateway's record: it measures from the gateway's arrival to the gateway's relay, so its
  TTFT and E2EL are longer by the hop in (gateway → vLLM's HTTP server → engine arrival,
  ~2 ms here) plus the hop back (the engine's output → vLLM's stream → the gateway's relay).
  Both are measured on the host's one wall clock and printed. Like with like — the hop in
  subtracted, i.e. the instants of the first token and of the end at the gateway against
  the engine's — they differ by the hop back, the gateway's relay: printed, held to
  :data:`HOP_MEDIAN_S` at the median and :data:`HOP_BOUND_S` for every request (a timing
  bound for a shared machine, not the measurement: docs/ingest.md has the figures).

The engine's records go to the engine's goodput counts twice here (plugin and OTLP); a
deployment uses one of the two. vLLM starts twice: the module runs after the tests that use
the session's PD pair and stops it first (``conftest.RUNS_LAST``).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporters.latency import request_latencies
from exporters.records import RecordBatch, RequestRecord, Status, TokenDetail, Vantage
from serving.workers import SupervisorSettings, VllmSpec, WorkerSupervisor

from .conftest import (
    ENGINE_NICE,
    READY_TIMEOUT_S,
    ControlPlane,
    free_port,
    stop_pd_pairs,
    token_prompt,
)
from .live_stack import gateways

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

#: The issue's bound: an OTLP record's TTFT/E2EL against the plugin's (the same engine
#: clocks, every request) and against the gateway's with the hop in subtracted (median).
SAME_INTERVAL_S = 0.002
#: The hop back at the median: 1.3-2.0 ms measured on a quiet machine, 2.02 ms once under a
#: load average of 6 (docs/ingest.md); held loosely, as a timing check on a shared machine.
HOP_MEDIAN_S = 0.010
#: The hop back for every request: 0.5–3 ms measured
#: (docs/ingest.md); this bounds it on a 2-core machine that others load too. The hop in is
#: only checked causal: vLLM's HTTP server runs at the engine's low CPU priority
#: (``ENGINE_NICE``, SCHED_IDLE), so others' load delays it (2 ms at the median, 85 ms seen).
HOP_BOUND_S = 0.050
NUM_WARMUP = 2
NUM_REQUESTS = 12
MAX_TOKENS = 16


class OtlpTap:
    """The OTLP batches the control plane's ingestor applied (``exporter_id`` ``""``)."""

    def __init__(self) -> None:
        self.batches: list[RecordBatch] = []

    def __call__(self, batch: RecordBatch, exporter_id: str) -> None:
        if exporter_id == "":
            self.batches.append(batch)

    def records(self) -> dict[str, RequestRecord]:
        return {r.request_id: r for b in list(self.batches) for r in b.records()}


@pytest.fixture(scope="module")
def otlp_tap(control_plane: ControlPlane) -> Iterator[OtlpTap]:
    stop_pd_pairs()  # two vLLM instances at a time on this machine
    tap = OtlpTap()
    ingestor = control_plane.app.state.live.ingestor
    ingestor.add_listener(tap)
    try:
        yield tap
    finally:
        ingestor.remove_listener(tap)


def otlp_env(protocol: str, control_plane: ControlPlane) -> tuple[dict[str, str], str]:
    """The OpenTelemetry environment and the ``--otlp-traces-endpoint`` for ``protocol``."""
    key = control_plane.keys["ingest"]
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"authorization=Bearer%20{key}",
        "OTEL_SERVICE_NAME": "tiny",  # vLLM's span names no model: the label comes from here
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms; the SDK's default 5 s slows the test only
    }
    if protocol == "grpc":
        return env, f"http://127.0.0.1:{control_plane.otlp_grpc_port}"
    return env, f"{control_plane.url}/v1/traces"


def stream(url: str, prompt: list[int], request_id: str) -> int:
    """One streamed completion through ``url``; its completion tokens."""
    body = {
        "model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    tokens = 0
    with httpx.stream(
        "POST", f"{url}/v1/completions", json=body, headers={"x-request-id": request_id},
        timeout=120,
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                tokens = usage["completion_tokens"] if usage else tokens
    return tokens


def ingest_counts(control_plane: ControlPlane) -> dict[str, float]:
    """The OTLP ingest counters on the control plane's ``/metrics``."""
    response = httpx.get(
        f"{control_plane.url}/metrics", headers=control_plane.headers("viewer"), timeout=10
    )
    assert response.status_code == 200, response.text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            if s.name == "goodput_ingest_records_total" and s.labels["protocol"] == "otlp":
                counts["records"] = s.value
            elif s.name == "goodput_ingest_otlp_spans_total":
                counts[s.labels["outcome"]] = s.value
    return counts


def latencies(record: RequestRecord) -> tuple[float, float]:
    lat = request_latencies(RecordBatch.from_records([record]))
    return float(lat.ttft_s[0]), float(lat.e2el_s[0])


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def summary(name: str, values: list[float]) -> str:
    ms = [v * 1e3 for v in values]
    return f"{name}: median {statistics.median(ms):.3f} ms, min {min(ms):.3f}, max {max(ms):.3f}"


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_vllm_spans_become_records_that_match_the_gateway(
    protocol: str,
    otlp_tap: OtlpTap,
    control_plane: ControlPlane,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    env, endpoint = otlp_env(protocol, control_plane)
    port = free_port()
    spec = VllmSpec(
        model=tiny_model,
        port=port,
        cpu=0,
        served_model_name="tiny",
        nice=ENGINE_NICE,
        sched_idle=True,
        engine_env={
            "GOODPUT_CONTROL_PLANE_URL": control_plane.url,
            "GOODPUT_INGEST_KEY": control_plane.keys["ingest"],
            **env,
        },
        extra_args=("--otlp-traces-endpoint", endpoint),
    )
    settings = SupervisorSettings(health_interval_s=0.5, backoff_initial_s=0.5)
    worker = WorkerSupervisor(spec, run_dir=tmp_path / "worker", settings=settings)
    tag = protocol.split("/", maxsplit=1)[0]
    ids = [f"otlp-{tag}-{i}" for i in range(NUM_WARMUP + NUM_REQUESTS)]
    before = ingest_counts(control_plane)
    started = time.monotonic()
    worker.start()
    try:
        worker.wait_ready(READY_TIMEOUT_S)
        ready_s = time.monotonic() - started
        statics = ["--colocated", spec.url]
        with gateways(control_plane, tmp_path, statics, {f"gw-otlp-{tag}": False}) as urls:
            (url,) = urls.values()
            for i, request_id in enumerate(ids):
                assert stream(url, token_prompt(200, seed=4000 + i), request_id) == MAX_TOKENS
            deadline = time.monotonic() + 30
            while not set(ids) <= otlp_tap.records().keys():
                missing = set(ids) - otlp_tap.records().keys()
                assert time.monotonic() < deadline, f"no OTLP record of {sorted(missing)}"
                time.sleep(0.2)
        load = load_average()
    finally:
        worker.stop()
    otlp = otlp_tap.records()
    after = ingest_counts(control_plane)
    # Every request became one OTLP record, and nothing else came (no span was rejected).
    assert after["records"] - before["records"] == len(ids)
    assert after["mapped"] - before["mapped"] == len(ids)
    assert after["rejected"] == before["rejected"]

    same_ttft, same_e2el, hop_ttft, hop_e2el, hop_in = [], [], [], [], []
    for request_id in ids[NUM_WARMUP:]:
        record = otlp[request_id]
        assert (record.vantage, record.token_detail) == (Vantage.ENGINE, TokenDetail.SUMMARY)
        assert (record.status, record.labels.model) == (Status.OK, "tiny")
        assert (record.prompt_tokens, record.output_tokens) == (200, MAX_TOKENS)
        (plugin,) = control_plane.wait_for_records(
            lambda found: len(found) == 1, vantage=Vantage.ENGINE, request_id=request_id
        )
        (gateway,) = control_plane.wait_for_records(
            lambda found: len(found) == 1, vantage=Vantage.GATEWAY, request_id=request_id
        )
        ttft, e2el = latencies(record)
        plugin_ttft, plugin_e2el = latencies(plugin)
        gateway_ttft, gateway_e2el = latencies(gateway)
        assert abs(record.arrival_time_ns - plugin.arrival_time_ns) <= 1_000  # one clock read
        same_ttft.append(ttft - plugin_ttft)
        same_e2el.append(e2el - plugin_e2el)
        hop_ttft.append(gateway_ttft - ttft)
        hop_e2el.append(gateway_e2el - e2el)
        hop_in.append((record.arrival_time_ns - gateway.arrival_time_ns) / 1e9)
    # The hop back: when the gateway relayed the first token / the end, minus when the
    # engine produced it (the whole difference less the hop in).
    back_ttft = [d - h for d, h in zip(hop_ttft, hop_in, strict=True)]
    back_e2el = [d - h for d, h in zip(hop_e2el, hop_in, strict=True)]
    print(
        f"\n{protocol}: vLLM ready in {ready_s:.0f} s; load average {load}; "
        f"{NUM_REQUESTS} requests of {MAX_TOKENS} tokens",
        summary("OTLP - plugin TTFT", same_ttft),
        summary("OTLP - plugin E2EL", same_e2el),
        summary("gateway - OTLP TTFT", hop_ttft),
        summary("gateway - OTLP E2EL", hop_e2el),
        summary("hop in (engine arrival - gateway arrival)", hop_in),
        summary("hop back, first token (gateway - engine)", back_ttft),
        summary("hop back, end (gateway - engine)", back_e2el),
        sep="\n  ",
    )
    assert max(map(abs, same_ttft + same_e2el)) <= SAME_INTERVAL_S
    # One wall clock: the gateway saw each request before the engine did, and its first
    # token and end after the engine produced them (µs rounding of the records aside).
    assert min(hop_in + back_ttft + back_e2el) >= -1e-5
    assert statistics.median(back_ttft) <= HOP_MEDIAN_S
    assert statistics.median(back_e2el) <= HOP_MEDIAN_S
    assert max(back_ttft + back_e2el) <= HOP_BOUND_S
