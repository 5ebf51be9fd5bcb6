"""OTLP spans → request records: vLLM summary spans, token events, rejections, codecs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from controlplane.ingest import (
    OtlpDecodeError,
    export_response,
    map_spans,
    parse_export_request,
    rpc_status,
)
from exporters.latency import itl_gaps_s, request_latencies
from exporters.records import Phase, Status, TokenDetail, Vantage
from tests.unit.controlplane.ingest.otlp_builders import (
    T0_NS,
    export_request,
    span,
    vllm_attributes,
)

MS = 1_000_000


def test_a_vllm_span_becomes_a_summary_engine_record() -> None:
    mapping = map_spans(export_request(span(vllm_attributes(**{"gen_ai.response.model": "m"}))))
    assert (mapping.num_spans, mapping.num_ignored, mapping.num_rejected) == (1, 0, 0)
    (record,) = mapping.batch.records()
    assert record.request_id == "1"  # vLLM's "cmpl-1": the client's id
    assert record.vantage is Vantage.ENGINE
    assert record.token_detail is TokenDetail.SUMMARY
    assert record.arrival_time_ns == T0_NS
    assert record.labels.model == "m"
    assert record.prompt_tokens == 50
    assert record.emission_offsets_us.tolist() == [200_000, 1_200_000]
    assert record.tokens_per_emission().tolist() == [1, 10]
    assert record.status is Status.OK
    phases = record.phase_offsets_us
    # scheduled = TTFT − prefill = 0.1 s; queued = scheduled − time_in_queue = 0.05 s
    assert phases[Phase.QUEUED] == 50_000
    assert phases[Phase.PREFILL_START] == 100_000
    assert phases[Phase.PREFILL_END] == 200_000
    assert phases[Phase.FINISHED] == 1_200_000
    lat = request_latencies(mapping.batch)
    assert lat.ttft_s.tolist() == [0.2]
    assert lat.e2el_s.tolist() == [1.2]
    assert lat.tpot_s[0] == pytest.approx(0.1)
    assert math.isnan(lat.itl_max_s[0])  # a summary gives no ITL


@pytest.mark.parametrize(
    ("completion", "offsets", "tokens"),
    [(1, [200_000], [1]), (0, [], []), (2, [200_000, 1_200_000], [1, 1])],
)
def test_short_outputs(completion: int, offsets: list[int], tokens: list[int]) -> None:
    mapping = map_spans(export_request(span(vllm_attributes(completion=completion))))
    (record,) = mapping.batch.records()
    assert record.emission_offsets_us.tolist() == offsets
    assert record.tokens_per_emission().tolist() == tokens
    assert request_latencies(mapping.batch).e2el_s.tolist() == [0.2 if completion == 1 else 1.2]


@pytest.mark.parametrize(
    ("extra", "model"),
    [
        ({"gen_ai.request.model": "req", "gen_ai.response.model": "resp"}, "req"),
        ({"gen_ai.response.model": "resp"}, "resp"),
        ({}, "vllm-0"),
    ],
)
def test_model_comes_from_request_then_response_then_service(
    extra: dict[str, str], model: str
) -> None:
    mapping = map_spans(export_request(span(vllm_attributes(**extra))))
    assert mapping.batch.labels["model"].decode() == [model]


@pytest.mark.parametrize(
    ("span_id", "vantage", "record_id"),
    [
        ("cmpl-gw-7-0", None, "gw-7"),  # /v1/completions, X-Request-Id gw-7
        ("cmpl-gw-7-2", None, "gw-7-2"),  # the third prompt of a batch
        ("chatcmpl-gw-7", None, "gw-7"),  # /v1/chat/completions
        ("chatcmpl-gw-7", "engine", "gw-7"),
        ("cmpl-", None, "cmpl-"),
        ("req-9", None, "req-9"),  # another producer's id: unchanged
        ("cmpl-gw-7-0", "gateway", "cmpl-gw-7-0"),  # a gateway's id is its own
    ],
)
def test_an_engine_record_carries_the_client_request_id(
    span_id: str, vantage: str | None, record_id: str
) -> None:
    extra = {"goodput.vantage": vantage} if vantage else {}
    mapping = map_spans(export_request(span(vllm_attributes(request_id=span_id, **extra))))
    assert mapping.batch.request_ids == [record_id]


def test_token_events_give_full_detail_and_itl() -> None:
    times = [T0_NS + 100 * MS, T0_NS + 150 * MS, T0_NS + 190 * MS]
    attributes = {"gen_ai.request.id": "r-full", "goodput.vantage": "gateway"}
    mapping = map_spans(export_request(span(attributes, token_times_ns=times)))
    (record,) = mapping.batch.records()
    assert record.token_detail is TokenDetail.FULL
    assert record.vantage is Vantage.GATEWAY
    assert record.emission_offsets_us.tolist() == [100_000, 150_000, 190_000]
    gaps, _ = itl_gaps_s(mapping.batch)
    assert gaps.tolist() == pytest.approx([0.05, 0.04])
    # E2EL without the attribute: the span's end is the finish phase.
    assert record.phase_offsets_us[Phase.FINISHED] == 2_000_000


def test_token_events_may_carry_several_tokens() -> None:
    times = [T0_NS + 100 * MS, T0_NS + 300 * MS]
    attributes = {"gen_ai.usage.completion_tokens": 5}
    mapping = map_spans(export_request(span(attributes, token_times_ns=times, token_counts=[1, 4])))
    (record,) = mapping.batch.records()
    assert record.output_tokens == 5
    assert request_latencies(mapping.batch).tpot_s[0] == pytest.approx(0.05)


def test_events_are_one_token_each_when_the_count_agrees() -> None:
    times = [T0_NS + 100 * MS, T0_NS + 300 * MS]
    attributes = {"gen_ai.usage.completion_tokens": 2}
    mapping = map_spans(export_request(span(attributes, token_times_ns=times, token_counts=[9, 9])))
    assert mapping.batch.emission_tokens.tolist() == [1, 1]
    bad = span({"gen_ai.usage.completion_tokens": 7}, token_times_ns=times, token_counts=[1, 0])
    assert map_spans(export_request(bad)).reasons == (
        "span 0 (0102030405060708): event goodput.tokens must be an int in [1, 1048576], got 0",
    )


def test_without_the_e2e_attribute_the_span_duration_is_the_e2el() -> None:
    # What our OTelExporter sends for a request shed before any token (E2EL undefined).
    attributes = {"gen_ai.usage.completion_tokens": 0, "goodput.status": "rejected"}
    mapping = map_spans(export_request(span(attributes, end_ns=T0_NS + 3 * MS)))
    (record,) = mapping.batch.records()
    assert record.status is Status.REJECTED
    assert record.phase_offsets_us[Phase.FINISHED] == 3000
    late_first_token = {
        "gen_ai.usage.completion_tokens": 3,
        "gen_ai.latency.time_to_first_token": 1.0,
    }
    mapping = map_spans(export_request(span(late_first_token, end_ns=T0_NS + 500 * MS)))
    assert mapping.reasons == (
        "span 0 (0102030405060708): gen_ai.latency.time_to_first_token 1.0 exceeds the E2EL "
        "0.5 (the span's duration)",
    )


def test_error_status_and_goodput_status() -> None:
    mapping = map_spans(
        export_request(
            span(vllm_attributes(request_id="a"), error="engine died"),
            span(vllm_attributes(request_id="b", **{"goodput.status": "aborted"})),
        )
    )
    assert mapping.batch.status.tolist() == [Status.ERROR, Status.ABORTED]
    assert mapping.batch.reason.decode() == ["engine died", ""]


def test_other_spans_are_ignored_not_rejected() -> None:
    mapping = map_spans(export_request(span({}, name="http.request"), span(vllm_attributes())))
    assert (mapping.num_spans, mapping.num_ignored, mapping.num_rejected) == (2, 1, 0)
    assert len(mapping.batch) == 1


def test_unmappable_spans_are_rejected_alone_with_reasons() -> None:
    good = span(vllm_attributes(request_id="ok"))
    missing = span({"gen_ai.latency.time_to_first_token": 0.1}, span_id=b"\xaa" * 8)
    inverted = span(vllm_attributes(ttft_s=2.0, e2e_s=1.0), span_id=b"\xbb" * 8)
    negative = span(vllm_attributes(ttft_s=-0.1), span_id=b"\xcc" * 8)
    text = span(vllm_attributes(**{"gen_ai.latency.e2e": "1.2"}), span_id=b"\xdd" * 8)
    bad_status = span(vllm_attributes(**{"goodput.status": "meh"}), span_id=b"\xee" * 8)
    mapping = map_spans(export_request(good, missing, inverted, negative, text, bad_status))
    assert mapping.batch.request_ids == ["ok"]
    assert mapping.num_rejected == 5
    assert mapping.reasons == (
        "span 1 (aaaaaaaaaaaaaaaa): gen_ai.usage.completion_tokens is missing (and the span "
        "has no token events)",
        "span 2 (bbbbbbbbbbbbbbbb): gen_ai.latency.time_to_first_token 2.0 exceeds the E2EL "
        "1.0 (gen_ai.latency.e2e)",
        "span 3 (cccccccccccccccc): gen_ai.latency.time_to_first_token must be in [0, 604800] "
        "seconds, "
        "got -0.1",
        "span 4 (dddddddddddddddd): gen_ai.latency.e2e must be a number, got '1.2'",
        "span 5 (eeeeeeeeeeeeeeee): goodput.status must be one of ['ok', 'error', 'aborted', "
        "'rejected'], got 'meh'",
    )
    assert mapping.error_message == "5 llm_request span(s) rejected: " + "; ".join(mapping.reasons)


def test_the_error_message_quotes_five_reasons_and_counts_the_rest() -> None:
    spans = [span({}, span_id=bytes([k]) * 8) for k in range(1, 8)]
    mapping = map_spans(export_request(*spans))
    assert mapping.num_rejected == 7
    assert mapping.error_message.startswith("7 llm_request span(s) rejected: span 0 ")
    assert mapping.error_message.count("is missing") == 5
    assert mapping.error_message.endswith("; and 2 more")


def test_token_events_out_of_order_or_before_start_reject_that_span() -> None:
    ordered = span({"gen_ai.request.id": "ok"}, token_times_ns=[T0_NS + MS, T0_NS + 2 * MS])
    backwards = span({"gen_ai.request.id": "back"}, token_times_ns=[T0_NS + 5 * MS, T0_NS + 2 * MS])
    early = span({"gen_ai.request.id": "early"}, token_times_ns=[T0_NS - MS, T0_NS + MS])
    mapping = map_spans(export_request(backwards, ordered, early))
    assert mapping.batch.request_ids == ["ok"]
    assert mapping.batch.emission_offsets_us.tolist() == [1000, 2000]
    assert [r.split(":")[0] for r in mapping.reasons] == [
        "span 0 (request 'back')",
        "span 2 (request 'early')",
    ]


def test_protobuf_and_json_bodies_parse_to_the_same_records() -> None:
    request = export_request(span(vllm_attributes()), span({}, token_times_ns=[T0_NS + MS]))
    from_proto = parse_export_request(request.SerializeToString(), "application/x-protobuf")
    document = json.loads(json_format.MessageToJson(request))
    # OTLP/JSON writes ids as hex, not protobuf's base64.
    for s in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        s["spanId"] = "0102030405060708"
        s["traceId"] = "11" * 16
    from_json = parse_export_request(
        json.dumps(document).encode(), "application/json; charset=utf-8"
    )
    a, b = map_spans(from_proto).batch, map_spans(from_json).batch
    assert a.request_ids == b.request_ids == ["1", "0102030405060708"]
    assert a.emission_offsets_us.tolist() == b.emission_offsets_us.tolist()
    assert np.array_equal(a.phase_offsets_us, b.phase_offsets_us)


@pytest.mark.parametrize(
    ("body", "content_type", "message"),
    [
        (b"\xff\xff\xff", "application/x-protobuf", "body: not an ExportTraceServiceRequest"),
        (b"{", "application/json", "body: not an OTLP/JSON ExportTraceServiceRequest"),
        (b"[]", "application/json", "expected a JSON object, got list"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "zz"}]}]}]}',
            "application/json",
            "spanId: must be a hex string, got 'zz'",
        ),
        (b"", "text/plain", "content-type must be 'application/x-protobuf'"),
    ],
)
def test_undecodable_bodies_name_the_problem(body: bytes, content_type: str, message: str) -> None:
    with pytest.raises(OtlpDecodeError, match=message.replace("[", r"\[")):
        parse_export_request(body, content_type)


def test_the_response_reports_partial_success_in_the_request_encoding() -> None:
    mapping = map_spans(export_request(span({}), span(vllm_attributes())))
    body, media = export_response(
        "application/x-protobuf", mapping.num_rejected, mapping.error_message
    )
    assert media == "application/x-protobuf"
    response = ExportTraceServiceResponse.FromString(body)
    assert response.partial_success.rejected_spans == 1
    assert "completion_tokens is missing" in response.partial_success.error_message
    body, media = export_response("application/json", 1, mapping.error_message)
    assert media == "application/json"
    assert json.loads(body)["partialSuccess"]["rejectedSpans"] == "1"
    clean, _ = export_response("x")
    assert ExportTraceServiceResponse.FromString(clean).HasField("partial_success") is False


def test_rpc_status_is_a_google_rpc_status() -> None:
    body, media = rpc_status(3, "body: bad ✓", "application/x-protobuf")
    status = status_pb2.Status.FromString(body)
    assert (status.code, status.message, media) == (3, "body: bad ✓", "application/x-protobuf")
    body, media = rpc_status(14, "later", "application/json")
    assert (json.loads(body), media) == ({"code": 14, "message": "later"}, "application/json")


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (
            span(vllm_attributes(completion=2**31)),
            "gen_ai.usage.completion_tokens must be an integer in [0, 1048576], got 2.14748e+09",
        ),
        (
            span(vllm_attributes(), start_ns=2**63, end_ns=2**63 + 1),
            f"start_time_unix_nano must be set (it is the request's arrival) and below 2**63, "
            f"got {2**63}",
        ),
        (
            span(vllm_attributes(e2e_s=1e300)),
            "gen_ai.latency.e2e must be in [0, 604800] seconds, got 1e+300",
        ),
        (
            span({"gen_ai.usage.completion_tokens": 0}, end_ns=T0_NS - 1),
            f"end_time_unix_nano {T0_NS - 1} is before start_time_unix_nano {T0_NS} "
            "(a negative duration)",
        ),
        (
            span(
                {"gen_ai.usage.completion_tokens": 3},
                token_times_ns=[T0_NS + MS, T0_NS + 2 * MS],
                token_counts=[1, 2**31],
            ),
            "event goodput.tokens must be an int in [1, 1048576], got 2147483648",
        ),
        (
            span({}, token_times_ns=[T0_NS + MS, 2**64 - 1]),
            f"token event time_unix_nano must be below 2**63, got {2**64 - 1}",
        ),
    ],
)
def test_out_of_range_spans_are_rejected_alone(bad: object, reason: str) -> None:
    """Regression: one span with a token count >= 2**31, a start >= 2**63 ns or a latency of
    1e300 s made the whole export a 500 and lost the good spans with it."""
    good = span(vllm_attributes(request_id="good"), span_id=b"\x09" * 8)
    mapping = map_spans(export_request(good, bad))
    assert mapping.batch.request_ids == ["good"]
    assert mapping.reasons == (f"span 1 (0102030405060708): {reason}",)
