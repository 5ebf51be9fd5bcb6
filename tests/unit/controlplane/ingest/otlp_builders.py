"""Builders of OTLP trace messages for the receiver's tests (vLLM-shaped spans)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

T0_NS = 1_700_000_000_000_000_000
Value = str | bool | int | float


def any_value(value: Value) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=value)


def key_values(attributes: Mapping[str, Value]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items()]


def vllm_attributes(
    *,
    ttft_s: float = 0.2,
    e2e_s: float = 1.2,
    completion: int = 11,
    prompt: int = 50,
    request_id: str = "cmpl-1",
    **extra: Value,
) -> dict[str, Value]:
    """What vLLM's output processor sets on ``llm_request`` (seconds as doubles)."""
    attributes: dict[str, Value] = {
        "gen_ai.latency.time_to_first_token": ttft_s,
        "gen_ai.latency.e2e": e2e_s,
        "gen_ai.latency.time_in_queue": 0.05,
        "gen_ai.latency.time_in_model_prefill": 0.1,
        "gen_ai.latency.time_in_model_decode": e2e_s - ttft_s,
        "gen_ai.usage.prompt_tokens": prompt,
        "gen_ai.usage.completion_tokens": completion,
        "gen_ai.request.id": request_id,
    }
    attributes.update(extra)
    return attributes


def span(
    attributes: Mapping[str, Value],
    *,
    name: str = "llm_request",
    start_ns: int = T0_NS,
    end_ns: int | None = None,
    token_times_ns: Sequence[int] = (),
    token_counts: Sequence[int] | None = None,
    span_id: bytes = b"\x01\x02\x03\x04\x05\x06\x07\x08",
    error: str | None = None,
) -> Span:
    """A span; ``token_times_ns`` are absolute times of ``token`` events."""
    out = Span(
        trace_id=b"\x11" * 16,
        span_id=span_id,
        name=name,
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=start_ns,
        end_time_unix_nano=end_ns if end_ns is not None else start_ns + 2_000_000_000,
        attributes=key_values(attributes),
    )
    for k, time_ns in enumerate(token_times_ns):
        event = out.events.add(time_unix_nano=time_ns, name="token")
        if token_counts is not None:
            event.attributes.append(
                KeyValue(key="goodput.tokens", value=any_value(token_counts[k]))
            )
    if error is not None:
        out.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR, message=error))
    return out


def export_request(*spans: Span, service: str = "vllm-0") -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.extend(key_values({"service.name": service}))
    scope = resource_spans.scope_spans.add()
    scope.scope.name = "vllm.llm_engine"
    scope.spans.extend(spans)
    return request
