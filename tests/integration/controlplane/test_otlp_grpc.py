"""OTLP/gRPC receiver (TraceService/Export): the real SDK gRPC exporter on loopback, statuses
of bad calls, one bad span rejected alone, and a control plane without the receiver."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from controlplane.models import KeyRole
from tests.integration.controlplane.test_ingest_transport import ServerFactory, new_key, serve
from tests.integration.controlplane.test_otlp_receiver import ENGINE_SLO, emit_vllm_request
from tests.unit.controlplane.ingest.otlp_builders import export_request, span, vllm_attributes

pytestmark = pytest.mark.integration
__all__ = ["serve"]  # the fixture, imported for this module's tests

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def grpc_port(server: Any) -> int:
    port = server.app.state.otlp_grpc_port
    assert isinstance(port, int) and port > 0, server.app.state.otlp_grpc_off
    return port


def call(port: int, body: bytes, key: str | None) -> tuple[grpc.StatusCode, str, bytes]:
    """One raw unary call (bytes in, bytes out): the status, its details and the reply."""
    metadata = () if key is None else (("authorization", f"Bearer {key}"),)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        export = channel.unary_unary(EXPORT)
        try:
            reply = export(body, metadata=metadata, timeout=10)
        except grpc.RpcError as err:
            return err.code(), err.details() or "", b""
        return grpc.StatusCode.OK, "", reply


async def test_the_sdk_grpc_exporter_feeds_goodput(serve: ServerFactory, database_url: str) -> None:
    server = serve(otlp_grpc_port=0)
    port = grpc_port(server)
    admin = {"Authorization": f"Bearer {await new_key(database_url, KeyRole.ADMIN)}"}
    ingest = await new_key(database_url, KeyRole.INGEST)
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm-cpu"}))
    exporter = OTLPSpanExporter(
        endpoint=f"http://127.0.0.1:{port}",
        headers=(("authorization", f"Bearer {ingest}"),),
        insecure=True,
        compression=grpc.Compression.Gzip,
        timeout=10,
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.llm_engine")
    now_ns = time.time_ns()
    async with httpx.AsyncClient(base_url=server.url, headers=admin) as http:
        assert (await http.post("/api/v1/slos", json=ENGINE_SLO)).status_code == 201
        await http.get("/api/v1/slos/engine-chat/goodput?window=1m")

        def emit() -> None:
            for k, (ttft, e2e, n) in enumerate([(0.1, 1.1, 21), (0.4, 1.4, 21), (0.1, 3.1, 21)]):
                emit_vllm_request(tracer, now_ns - 10_000_000_000 + k, ttft, e2e, n)
            provider.shutdown()

        await asyncio.to_thread(emit)
        body = (await http.get("/api/v1/slos/engine-chat/goodput?window=1m")).json()
        assert (body["requests"], body["good"]) == (3, 1)
        assert body["violations"] == {"ttft": 1, "tpot": 1}
        assert body["ttft"]["p50_s"] == pytest.approx(0.1, rel=0.01)
        metrics = (await http.get("/metrics")).text
        assert 'goodput_ingest_otlp_spans_total{outcome="mapped"} 3.0' in metrics


async def test_bad_calls_get_the_grpc_status_and_a_bad_span_is_rejected_alone(
    serve: ServerFactory, database_url: str
) -> None:
    server = serve(otlp_grpc_port=0)
    port = grpc_port(server)
    ingest = await new_key(database_url, KeyRole.INGEST)
    viewer = await new_key(database_url, KeyRole.VIEWER)
    good = export_request(span(vllm_attributes(request_id="ok")))
    now_ns = time.time_ns() - 5 * 10**9

    def run() -> dict[str, tuple[grpc.StatusCode, str, bytes]]:
        return {
            "no key": call(port, good.SerializeToString(), None),
            "unknown key": call(port, good.SerializeToString(), "gp_" + "x" * 40),
            "viewer": call(port, good.SerializeToString(), viewer),
            "garbage": call(port, b"\xff\xff\xff\x07not a protobuf", ingest),
            "mixed": call(
                port,
                export_request(
                    span(vllm_attributes(request_id="fine"), start_ns=now_ns),
                    span(vllm_attributes(request_id="huge", completion=2**31), start_ns=now_ns),
                    span(
                        vllm_attributes(request_id="eternal", ttft_s=1e300, e2e_s=1e300),
                        start_ns=now_ns,
                    ),
                    span(vllm_attributes(request_id="future"), start_ns=2**63),
                ).SerializeToString(),
                ingest,
            ),
        }

    results = await asyncio.to_thread(run)
    assert results["no key"][:2] == (
        grpc.StatusCode.UNAUTHENTICATED,
        "metadata 'authorization: Bearer <API key>' is required",
    )
    assert results["unknown key"][:2] == (
        grpc.StatusCode.UNAUTHENTICATED,
        "invalid API key: unknown or revoked",
    )
    code, details, _ = results["viewer"]
    assert code is grpc.StatusCode.PERMISSION_DENIED
    assert details.startswith("TraceService/Export needs role 'ingest' (allowed: admin, ingest)")
    code, details, _ = results["garbage"]
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("body: not an ExportTraceServiceRequest protobuf")
    code, _, reply = results["mixed"]
    assert code is grpc.StatusCode.OK
    response = ExportTraceServiceResponse.FromString(reply)
    assert response.partial_success.rejected_spans == 3
    message = response.partial_success.error_message
    assert message.startswith("3 llm_request span(s) rejected: span 1 ")
    assert "gen_ai.usage.completion_tokens must be an integer in" in message
    assert "gen_ai.latency.time_to_first_token must be in [0, " in message
    assert "start_time_unix_nano must be set (it is the request's arrival) and below 2**63" in (
        message
    )
    admin = {"Authorization": f"Bearer {await new_key(database_url, KeyRole.ADMIN)}"}
    async with httpx.AsyncClient(base_url=server.url, headers=admin) as http:
        metrics = (await http.get("/metrics")).text
    assert 'goodput_ingest_otlp_spans_total{outcome="mapped"} 1.0' in metrics
    assert 'goodput_ingest_otlp_spans_total{outcome="rejected"} 3.0' in metrics


async def test_too_large_a_message_is_resource_exhausted(
    serve: ServerFactory, database_url: str
) -> None:
    server = serve(otlp_grpc_port=0, max_ingest_bytes=4096)
    port = grpc_port(server)
    ingest = await new_key(database_url, KeyRole.INGEST)
    big = ExportTraceServiceRequest()
    big.MergeFrom(export_request(*(span(vllm_attributes(request_id=f"r{k}")) for k in range(80))))
    assert big.ByteSize() > 4096
    code, _, _ = await asyncio.to_thread(call, port, big.SerializeToString(), ingest)
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_without_a_port_or_without_grpcio_the_receiver_is_off_and_says_why(
    serve: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    off = serve()
    assert off.app.state.otlp_grpc_port is None
    assert off.app.state.otlp_grpc_off == "GOODPUT_OTLP_GRPC_PORT is unset"
    import builtins

    real_import = builtins.__import__

    def no_grpc(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "grpc" or name.startswith("grpc."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_grpc)
    without = serve(otlp_grpc_port=0)
    monkeypatch.undo()
    assert without.app.state.otlp_grpc_port is None
    assert without.app.state.otlp_grpc_off == (
        "grpcio is not installed (pip install 'goodput[grpc]')"
    )
    async with httpx.AsyncClient(base_url=without.url) as http:
        assert (await http.get("/health")).status_code == 200
