"""Fuzzing the wire and OTLP decoders (hypothesis, bounded): hostile bodies raise only the
documented error, and never make the decoder allocate more than a fixed multiple of the
body (plus a constant), however large the counts and lengths they declare."""

from __future__ import annotations

import contextlib
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from controlplane.ingest import OtlpDecodeError, map_spans, parse_export_request
from exporters.records import Labels, RecordBatch, RequestRecord, Vantage
from exporters.wire import WireError, decode_batch, encode_batch

pytestmark = pytest.mark.faults

#: The most a decoder may allocate: this many times the body, plus a constant.
BODY_MULTIPLE = 64
CONSTANT_BYTES = 4 << 20
FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)


def peak_bytes(call: Callable[[], Any]) -> int:
    """Peak traced allocation while ``call`` runs (its result or error ignored)."""
    tracemalloc.start()
    try:
        with contextlib.suppress(WireError, OtlpDecodeError):  # the documented errors
            call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def valid_body() -> dict[str, Any]:
    batch = RecordBatch.from_records(
        [
            RequestRecord(
                request_id=f"r{k}",
                vantage=Vantage.GATEWAY,
                arrival_time_ns=1_800_000_000 * 10**9,
                labels=Labels(model="m"),
                emission_offsets_us=np.array([100, 200, 300]),
            )
            for k in range(3)
        ]
    )
    body: dict[str, Any] = msgpack.unpackb(
        msgpack.unpackb(encode_batch(batch, exporter_id="gw", seq=1))["body"]
    )
    return body


def seal(body: dict[str, Any]) -> bytes:
    packed = msgpack.packb(body, use_bin_type=True)
    return msgpack.packb({"v": 1, "crc32": zlib.crc32(packed), "body": packed}, use_bin_type=True)


FIELDS = list(valid_body())
hostile_values = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([0, 1, 2**24, 2**31 - 1, 2**32 - 1, 2**62, 2**63 - 1]),
    st.binary(max_size=64),
    st.none(),
    st.text(max_size=8),
    st.lists(st.text(max_size=4), max_size=8),
)


@FUZZ
@given(st.dictionaries(st.sampled_from(FIELDS), hostile_values, max_size=6))
def test_wire_bodies_with_hostile_fields(changes: dict[str, Any]) -> None:
    body = valid_body()
    body.update(changes)
    data = seal(body)
    peak = peak_bytes(lambda: decode_batch(data))
    assert peak <= BODY_MULTIPLE * len(data) + CONSTANT_BYTES, (changes, peak)


@FUZZ
@given(st.binary(max_size=2048))
def test_wire_random_bytes(data: bytes) -> None:
    peak = peak_bytes(lambda: decode_batch(data))
    assert peak <= BODY_MULTIPLE * len(data) + CONSTANT_BYTES


numbers = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2**31, 2**63 - 1, 1e300, -1e300, 0.0]),
)
ATTRIBUTES = [
    "gen_ai.latency.time_to_first_token", "gen_ai.latency.e2e", "gen_ai.latency.time_in_queue",
    "gen_ai.latency.time_in_model_prefill", "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.completion_tokens",
]  # fmt: skip
u64 = st.integers(0, 2**64 - 1)


def any_value(value: int | float) -> AnyValue:
    return AnyValue(int_value=value) if isinstance(value, int) else AnyValue(double_value=value)


@st.composite
def export_requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    for k in range(draw(st.integers(1, 4))):
        span = spans.add(
            name="llm_request", span_id=k.to_bytes(8, "big"),
            start_time_unix_nano=draw(u64), end_time_unix_nano=draw(u64),
        )  # fmt: skip
        for key in draw(st.lists(st.sampled_from(ATTRIBUTES), max_size=6, unique=True)):
            span.attributes.append(KeyValue(key=key, value=any_value(draw(numbers))))
        for _ in range(draw(st.integers(0, 5))):
            event = span.events.add(name="token", time_unix_nano=draw(u64))
            if draw(st.booleans()):
                tokens = any_value(draw(st.integers(-(2**63), 2**63 - 1)))
                event.attributes.append(KeyValue(key="goodput.tokens", value=tokens))
    return request


@FUZZ
@given(export_requests())
def test_otlp_spans_with_hostile_values_are_rejected_alone(
    request: ExportTraceServiceRequest,
) -> None:
    data = request.SerializeToString()
    mapping = None

    def decode() -> None:
        nonlocal mapping
        mapping = map_spans(parse_export_request(data, "application/x-protobuf"))

    peak = peak_bytes(decode)
    assert mapping is not None  # never an exception: bad spans are rejected one by one
    assert mapping.num_rejected + len(mapping.batch) == mapping.num_spans
    assert peak <= BODY_MULTIPLE * len(data) + CONSTANT_BYTES


@FUZZ
@given(st.binary(max_size=2048))
def test_otlp_random_bytes(data: bytes) -> None:
    def decode() -> None:
        map_spans(parse_export_request(data, "application/x-protobuf"))

    peak = peak_bytes(decode)
    assert peak <= BODY_MULTIPLE * len(data) + CONSTANT_BYTES
