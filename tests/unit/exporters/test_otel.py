"""OTelExporter: GenAI server metrics and vLLM-shaped spans, read back in memory."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, SpanKind, StatusCode

from exporters.buckets import LATENCY_BUCKETS_S
from exporters.otel import SPAN_NAME, OTelExporter
from exporters.records import NUM_PHASES, Labels, Phase, RequestRecord, Status, Vantage

ARRIVAL_NS = 1_700_000_000_000_000_000
BASE = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm"}


class Pipeline:
    """An SDK meter and tracer provider read back in memory."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))

    def exporter(self, **kwargs: Any) -> OTelExporter:
        return OTelExporter(self.meter_provider, self.tracer_provider, **kwargs)

    def points(self) -> dict[str, list[HistogramDataPoint]]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return {
            metric.name: list(metric.data.data_points)  # type: ignore[misc]
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
        }

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def span_names(self) -> list[Any]:
        """Each span's ``gen_ai.request.id``, or its name where it has none."""
        return [dict(s.attributes or {}).get("gen_ai.request.id", s.name) for s in self.finished()]


def record(
    request_id: str,
    offsets_ms: list[float],
    *,
    status: Status = Status.OK,
    reason: str = "",
    model: str = "llama",
    phases_ms: dict[Phase, float] | None = None,
    prompt_tokens: int = 0,
    final: bool = True,
) -> RequestRecord:
    phases = np.full(NUM_PHASES, -1, dtype=np.int64)
    for phase, ms in (phases_ms or {}).items():
        phases[phase] = round(ms * 1000)
    return RequestRecord(
        request_id=request_id,
        vantage=Vantage.ENGINE,
        arrival_time_ns=ARRIVAL_NS,
        labels=Labels(model=model, slo="chat-fast"),
        emission_offsets_us=np.array([round(ms * 1000) for ms in offsets_ms], dtype=np.int64),
        phase_offsets_us=phases,
        prompt_tokens=prompt_tokens,
        status=status,
        reason=reason,
        final=final,
    )


def test_genai_server_metrics_are_histograms_in_seconds_with_our_buckets() -> None:
    pipeline = Pipeline()
    exporter = pipeline.exporter()
    exporter.export(record("r1", [100.0, 150.0, 250.0]))
    exporter.export(record("r2", [200.0]))

    points = pipeline.points()  # no flush: the collection itself folds pending records
    assert set(points) == {
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.server.request.duration",
    }
    attrs = {**BASE, "gen_ai.request.model": "llama", "goodput.vantage": "engine"}
    ttft = points["gen_ai.server.time_to_first_token"]
    assert [dict(p.attributes or {}) for p in ttft] == [attrs]
    assert (ttft[0].count, ttft[0].sum) == (2, pytest.approx(0.3))
    assert tuple(ttft[0].explicit_bounds) == LATENCY_BUCKETS_S
    le_100ms = LATENCY_BUCKETS_S.index(0.1)
    assert ttft[0].bucket_counts[le_100ms] == 1  # exactly 100 ms: in le=0.1
    assert ttft[0].bucket_counts[LATENCY_BUCKETS_S.index(0.2)] == 1
    tpot = points["gen_ai.server.time_per_output_token"][0]
    assert (tpot.count, tpot.sum) == (1, pytest.approx(0.075))  # r2 has one token: undefined
    duration = points["gen_ai.server.request.duration"][0]
    assert (duration.count, duration.sum) == (2, pytest.approx(0.45))


def test_failed_requests_only_reach_request_duration_with_error_type() -> None:
    pipeline = Pipeline()
    exporter = pipeline.exporter()
    exporter.export(record("ok", [10.0, 20.0]))
    exporter.export(record("err", [30.0], status=Status.ERROR))
    exporter.export(record("gone", [], status=Status.ABORTED, phases_ms={Phase.FINISHED: 5.0}))

    points = pipeline.points()
    assert sum(p.count for p in points["gen_ai.server.time_to_first_token"]) == 1
    by_error = {
        (p.attributes or {}).get("error.type"): (p.count, p.sum)
        for p in points["gen_ai.server.request.duration"]
    }
    assert by_error == {
        None: (1, pytest.approx(0.02)),
        "error": (1, pytest.approx(0.03)),
        "aborted": (1, pytest.approx(0.005)),
    }


def test_one_llm_request_span_per_request_with_vllm_attributes() -> None:
    pipeline = Pipeline()
    exporter = pipeline.exporter()
    phases = {Phase.QUEUED: 1.0, Phase.PREFILL_START: 5.0, Phase.FINISHED: 300.0}
    exporter.export(record("r1", [100.0, 150.0, 250.0], phases_ms=phases, prompt_tokens=7))
    assert exporter.force_flush(1.0) is True

    (span,) = pipeline.finished()
    assert span.name == SPAN_NAME and span.kind == SpanKind.SERVER
    assert span.parent is None
    assert (span.start_time, span.end_time) == (ARRIVAL_NS, ARRIVAL_NS + 300_000_000)
    attrs = dict(span.attributes or {})
    assert attrs == {
        "gen_ai.request.id": "r1",
        "gen_ai.request.model": "llama",
        "gen_ai.usage.prompt_tokens": 7,
        "gen_ai.usage.completion_tokens": 3,
        "gen_ai.latency.time_to_first_token": pytest.approx(0.1),
        "gen_ai.latency.e2e": pytest.approx(0.25),
        "gen_ai.latency.time_in_queue": pytest.approx(0.004),  # scheduled - queued
        "gen_ai.latency.time_in_model_prefill": pytest.approx(0.095),  # first token - sched.
        "gen_ai.latency.time_in_model_decode": pytest.approx(0.15),  # last - first token
        "gen_ai.latency.time_in_model_inference": pytest.approx(0.245),  # last - scheduled
        "goodput.vantage": "engine",
        "goodput.status": "ok",
        "goodput.slo": "chat-fast",
    }
    assert span.status.status_code == StatusCode.UNSET


def test_spans_leave_out_what_is_undefined_and_mark_server_errors() -> None:
    pipeline = Pipeline()
    exporter = pipeline.exporter()
    exporter.export(record("e", [], status=Status.ERROR, reason="engine died"))
    exporter.force_flush()

    (span,) = pipeline.finished()
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == "engine died"
    assert (span.start_time, span.end_time) == (ARRIVAL_NS, ARRIVAL_NS)
    assert not any(k.startswith("gen_ai.latency.") for k in span.attributes or {})
    assert (span.attributes or {})["gen_ai.usage.completion_tokens"] == 0


def test_spans_are_roots_even_inside_an_active_span() -> None:
    pipeline = Pipeline()
    exporter = pipeline.exporter(fold_every=1)
    tracer = pipeline.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("handler"):
        exporter.export(record("r1", [10.0]))
    ours = [s for s in pipeline.finished() if s.name == SPAN_NAME]
    assert len(ours) == 1 and ours[0].parent is None


def test_records_fold_by_count_and_by_age_without_a_collection() -> None:
    now = [0.0]
    pipeline = Pipeline()
    exporter = pipeline.exporter(fold_every=3, max_delay_s=1.0, clock=lambda: now[0])
    exporter.export(record("a", [10.0]))
    exporter.export(record("b", [10.0]))
    assert pipeline.finished() == []
    exporter.export(record("c", [10.0]))  # the third: a fold
    assert len(pipeline.finished()) == 3
    exporter.export(record("d", [10.0]))
    now[0] = 1.5
    exporter.export(record("e", [10.0]))  # "d" waited past max_delay_s
    assert pipeline.span_names() == ["a", "b", "c", "d", "e"]


def test_partials_and_invalid_records_are_left_out() -> None:
    pipeline = Pipeline()
    exporter = pipeline.exporter()
    exporter.export(record("partial", [10.0], final=False))
    exporter.export(record("bad", [30.0, 10.0]))  # time runs backwards
    exporter.export(record("good", [10.0]))
    exporter.force_flush()

    assert pipeline.span_names() == ["good"]
    assert exporter.num_invalid_records == 1


def test_shutdown_stops_accepting_but_leaves_the_providers_running() -> None:
    pipeline = Pipeline()
    exporter = pipeline.exporter()
    exporter.export(record("before", [10.0]))
    exporter.shutdown()
    exporter.shutdown()
    exporter.export(record("after", [10.0]))
    exporter.force_flush()
    with pipeline.tracer_provider.get_tracer("test").start_as_current_span("still-works"):
        pass
    assert pipeline.span_names() == ["before", "still-works"]


def test_works_with_the_api_no_op_providers() -> None:
    exporter = OTelExporter(NoOpMeterProvider(), NoOpTracerProvider())
    exporter.export(record("r1", [10.0]))
    assert exporter.force_flush() is True
    exporter.shutdown()


def test_metrics_only_without_a_tracer_provider() -> None:
    pipeline = Pipeline()
    exporter = OTelExporter(pipeline.meter_provider)
    exporter.export(record("r1", [10.0]))
    assert exporter.force_flush() is True
    assert pipeline.points()["gen_ai.server.time_to_first_token"][0].count == 1
    assert pipeline.finished() == []


def test_constructor_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="fold_every must be >= 1, got 0"):
        Pipeline().exporter(fold_every=0)
    with pytest.raises(ValueError, match="max_delay_s must be >= 0, got -1"):
        Pipeline().exporter(max_delay_s=-1)
