"""POST /v1/traces: the real OpenTelemetry SDK exporter on loopback, vLLM-shaped spans
→ request records → goodput; encodings, partial success and errors."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from controlplane.models import KeyRole
from exporters.otel import OTelExporter
from exporters.records import Labels, RecordBatch, RequestRecord, Status, TokenDetail, Vantage
from tests.integration.controlplane.conftest import MakeKey, bearer
from tests.integration.controlplane.test_ingest_transport import ServerFactory, new_key, serve
from tests.unit.controlplane.ingest.otlp_builders import export_request, span, vllm_attributes

pytestmark = pytest.mark.integration
__all__ = ["serve"]  # the fixture, imported for this module's tests

TRACES = "/v1/traces"
PROTOBUF = {"Content-Type": "application/x-protobuf"}
ENGINE_SLO = {
    "name": "engine-chat",
    "selector": {"model": "llama"},
    "objectives": [
        {"metric": "ttft", "threshold_s": 0.25},
        {"metric": "tpot", "threshold_s": 0.05},
    ],
    "target": 0.9,
    "window_s": 86_400,
    "vantage": "engine",
}


def vllm_tracer(url: str, key: str) -> tuple[TracerProvider, Any]:
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm-cpu"}))
    exporter = OTLPSpanExporter(
        endpoint=f"{url}{TRACES}",
        headers={"Authorization": f"Bearer {key}"},
        compression=Compression.Gzip,
        timeout=10,
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, provider.get_tracer("vllm.llm_engine")


def emit_vllm_request(
    tracer: Any, arrival_ns: int, ttft_s: float, e2e_s: float, tokens: int, *, model: bool = True
) -> None:
    """What vLLM's output processor does when a request finishes."""
    with tracer.start_as_current_span(
        "llm_request", kind=SpanKind.SERVER, start_time=arrival_ns, end_on_exit=False
    ) as current:
        attributes = vllm_attributes(ttft_s=ttft_s, e2e_s=e2e_s, completion=tokens)
        if model:
            attributes["gen_ai.response.model"] = "llama"
        current.set_attributes(attributes)
        current.end(end_time=arrival_ns + int(e2e_s * 1e9))


async def test_the_sdk_exporter_feeds_goodput_with_vllm_spans(
    serve: ServerFactory, database_url: str
) -> None:
    server = serve()
    admin = {"Authorization": f"Bearer {await new_key(database_url, KeyRole.ADMIN)}"}
    provider, tracer = vllm_tracer(server.url, await new_key(database_url, KeyRole.INGEST))
    now_ns = time.time_ns()
    async with httpx.AsyncClient(base_url=server.url, headers=admin) as http:
        assert (await http.post("/api/v1/slos", json=ENGINE_SLO)).status_code == 201
        await http.get("/api/v1/slos/engine-chat/goodput?window=1m")
        cases = [  # (ttft, e2e, tokens): good, good, slow TTFT, slow TPOT
            (0.1, 1.1, 21),
            (0.2, 0.7, 11),
            (0.4, 1.4, 21),
            (0.1, 3.1, 21),
        ]

        def emit() -> None:
            for k, (ttft, e2e, n) in enumerate(cases):
                emit_vllm_request(tracer, now_ns - 10_000_000_000 + k, ttft, e2e, n)
            with tracer.start_as_current_span("http.request"):
                pass  # not an llm_request: ignored
            provider.shutdown()

        await asyncio.to_thread(emit)
        body = (await http.get("/api/v1/slos/engine-chat/goodput?window=1m")).json()
        assert (body["requests"], body["good"]) == (4, 2)
        assert body["violations"] == {"ttft": 1, "tpot": 1}
        assert body["output_tokens"] == 74
        assert body["ttft"]["p50_s"] == pytest.approx(0.1, rel=0.01)
        assert body["itl"]["p50_s"] is None  # unmodified vLLM gives no per-token times
        metrics = (await http.get("/metrics")).text
        assert 'goodput_ingest_otlp_spans_total{outcome="mapped"} 4.0' in metrics
        assert 'goodput_ingest_otlp_spans_total{outcome="ignored"} 1.0' in metrics


async def test_our_otel_exporter_round_trips_through_the_receiver(
    serve: ServerFactory, database_url: str
) -> None:
    """OTelExporter's spans (summary attributes, goodput.status) → the receiver → goodput,
    rejected requests included, so availability survives the OTLP path."""
    server = serve()
    admin = {"Authorization": f"Bearer {await new_key(database_url, KeyRole.ADMIN)}"}
    provider, _ = vllm_tracer(server.url, await new_key(database_url, KeyRole.INGEST))
    exporter = OTelExporter(MeterProvider(), provider, fold_every=1)
    arrival = time.time_ns() - 5 * 10**9
    records = [
        RequestRecord(
            request_id=f"r{k}",
            vantage=Vantage.ENGINE,
            arrival_time_ns=arrival,
            labels=Labels(model="llama"),
            emission_offsets_us=np.array([100_000, 120_000, 140_000]) * (1 + k),
        )
        for k in range(3)
    ]
    records.append(
        RequestRecord(
            request_id="shed",
            vantage=Vantage.ENGINE,
            arrival_time_ns=arrival,
            labels=Labels(model="llama"),
            status=Status.REJECTED,
            reason="queue full",
        )
    )
    async with httpx.AsyncClient(base_url=server.url, headers=admin) as http:
        assert (await http.post("/api/v1/slos", json=ENGINE_SLO)).status_code == 201
        await http.get("/api/v1/slos/engine-chat/goodput?window=1m")

        def emit() -> None:
            for record in records:
                exporter.export(record)
            exporter.force_flush()
            provider.shutdown()

        await asyncio.to_thread(emit)
        body = (await http.get("/api/v1/slos/engine-chat/goodput?window=1m")).json()
    # TTFT 0.1, 0.2, 0.3 s against 0.25 s; TPOT 0.02, 0.04, 0.06 s against 0.05 s: the
    # third request breaks both.
    assert (body["requests"], body["good"], body["rejected"]) == (3, 2, 1)
    assert body["violations"] == {"ttft": 1, "tpot": 1}
    assert body["availability_ratio"] == 0.75
    assert body["output_tokens"] == 9


@pytest.fixture
async def otlp_headers(make_key: MakeKey) -> dict[str, str]:
    return {**bearer(await make_key(KeyRole.INGEST, name="otlp")), **PROTOBUF}


def records_of(app: FastAPI) -> int:
    return int(app.state.live.engine.health().records)


@pytest.fixture
def applied(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> list[RequestRecord]:
    """Every record the receiver hands to the ingestor (a spy around the real call)."""
    seen: list[RequestRecord] = []
    ingestor = app.state.live.ingestor
    original = ingestor.apply_unsequenced

    def spy(batch: RecordBatch, **kwargs: Any) -> Any:
        seen.extend(batch.records())
        return original(batch, **kwargs)

    monkeypatch.setattr(ingestor, "apply_unsequenced", spy)
    return seen


async def test_protobuf_json_and_gzip_bodies_with_partial_success(
    app: FastAPI, client: httpx.AsyncClient, otlp_headers: dict[str, str]
) -> None:
    t0 = time.time_ns() - 5 * 10**9  # within the engine's window: every mapped span counts
    request = export_request(
        span(vllm_attributes(request_id="a"), start_ns=t0),
        span({"gen_ai.request.id": "broken"}, span_id=b"\x0b" * 8, start_ns=t0),
        span(
            {"gen_ai.request.id": "full"},
            start_ns=t0,
            token_times_ns=[t0 + 10**8, t0 + 10**8 + 10**7],
        ),
    )
    response = await client.post(TRACES, content=request.SerializeToString(), headers=otlp_headers)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-protobuf"
    partial = ExportTraceServiceResponse.FromString(response.content).partial_success
    assert partial.rejected_spans == 1
    assert partial.error_message == (
        "1 llm_request span(s) rejected: span 1 (0b0b0b0b0b0b0b0b): "
        "gen_ai.usage.completion_tokens is missing (and the span has no token events)"
    )
    assert records_of(app) == 2

    document = json.loads(
        json_format.MessageToJson(export_request(span(vllm_attributes(), start_ns=t0)))
    )
    only = document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    only["spanId"], only["traceId"] = "0102030405060708", "11" * 16  # OTLP/JSON: hex ids
    headers = {**otlp_headers, "Content-Type": "application/json", "Content-Encoding": "gzip"}
    body = gzip.compress(json.dumps(document).encode())
    response = await client.post(TRACES, content=body, headers=headers)
    assert response.status_code == 200
    assert response.json() == {}
    assert records_of(app) == 3


async def test_mapped_records_are_engine_vantage_summaries(
    app: FastAPI,
    client: httpx.AsyncClient,
    otlp_headers: dict[str, str],
    admin_headers: Any,
    applied: list[RequestRecord],
) -> None:
    slo = {**ENGINE_SLO, "objectives": [{"metric": "ttft", "threshold_s": 1.0}]}
    assert (await client.post("/api/v1/slos", json=slo, headers=admin_headers)).status_code == 201
    await app.state.live.refresh_slos()
    arrival = time.time_ns() - 5 * 10**9
    request = export_request(
        span(vllm_attributes(**{"gen_ai.request.model": "llama"}), start_ns=arrival),
        span(
            vllm_attributes(request_id="cmpl-2", **{"gen_ai.request.model": "llama"}),
            start_ns=arrival,
            error="x",
        ),
    )
    await client.post(TRACES, content=request.SerializeToString(), headers=otlp_headers)
    stats = (
        await client.get("/api/v1/slos/engine-chat/goodput?window=1m", headers=admin_headers)
    ).json()
    assert (stats["requests"], stats["good"], stats["errors"]) == (2, 1, 1)
    assert stats["tpot"]["p50_s"] == pytest.approx(0.1, rel=0.01)
    (error,) = [r for r in applied if r.status is Status.ERROR]
    assert (error.vantage, error.token_detail, error.reason) == (
        Vantage.ENGINE,
        TokenDetail.SUMMARY,
        "x",
    )


async def test_errors_are_google_rpc_statuses(
    app: FastAPI, client: httpx.AsyncClient, otlp_headers: dict[str, str], make_key: MakeKey
) -> None:
    response = await client.post(TRACES, content=b"\xff\xff", headers=otlp_headers)
    assert response.status_code == 400
    status = status_pb2.Status.FromString(response.content)
    assert status.code == 3
    assert status.message.startswith("body: not an ExportTraceServiceRequest protobuf")

    json_headers = {**otlp_headers, "Content-Type": "application/json"}
    response = await client.post(TRACES, content=b"[1]", headers=json_headers)
    assert response.status_code == 400
    assert response.json()["message"].endswith("expected a JSON object, got list)")

    response = await client.post(
        TRACES, content=b"x", headers={**otlp_headers, "Content-Type": "text/plain"}
    )
    assert response.status_code == 415
    assert response.json() == {
        "code": 3,
        "message": "content-type must be one of ['application/x-protobuf', "
        "'application/json'], got 'text/plain'",
    }
    limit = app.state.settings.max_ingest_bytes
    response = await client.post(
        TRACES, content=b"x", headers={**otlp_headers, "Content-Length": str(limit + 1)}
    )
    assert response.status_code == 413
    assert status_pb2.Status.FromString(response.content).message.startswith(
        f"body must be at most {limit} bytes"
    )
    viewer = {**bearer(await make_key(KeyRole.VIEWER)), **PROTOBUF}
    assert (await client.post(TRACES, content=b"", headers=viewer)).status_code == 403
    scoped = {**bearer(await make_key(KeyRole.INGEST, tenant="acme", name="acme-otlp")), **PROTOBUF}
    foreign = export_request(span(vllm_attributes(**{"goodput.tenant": "globex"})))
    response = await client.post(TRACES, content=foreign.SerializeToString(), headers=scoped)
    assert response.status_code == 403
    assert "scoped to tenant 'acme'" in status_pb2.Status.FromString(response.content).message
    assert records_of(app) == 0


@pytest.mark.parametrize(
    "body",
    [
        b'{"resourceSpans": 5}',
        b'{"resourceSpans": ["x"]}',
        b'{"resourceSpans": [{"scopeSpans": [1]}]}',
    ],
)
async def test_json_of_the_wrong_shape_is_a_400_not_a_500(
    app: FastAPI, client: httpx.AsyncClient, otlp_headers: dict[str, str], body: bytes
) -> None:
    headers = {**otlp_headers, "Content-Type": "application/json"}
    response = await client.post(TRACES, content=body, headers=headers)
    assert response.status_code == 400
    status = response.json()
    assert status["code"] == 3
    assert status["message"].startswith("body: not an OTLP/JSON ExportTraceServiceRequest (")
    assert records_of(app) == 0
