"""OTLP/HTTP traces → request records: vLLM's ``llm_request`` spans, and ours.

:func:`map_spans` turns the ``llm_request`` spans of an ``ExportTraceServiceRequest`` (read
by :mod:`controlplane.ingest.otlp_codec`) into one :class:`RecordBatch` with vantage
``ENGINE`` (unless ``goodput.vantage`` says otherwise) and arrival = span start; an engine
record's request id is the client's ``X-Request-Id`` behind vLLM's ``gen_ai.request.id``
(``cmpl-<id>-0`` → ``<id>``: :func:`~controlplane.ingest.otlp_attributes.client_request_id`):

* a span with :data:`TOKEN_EVENT` events gives ``FULL`` detail: one emission per event at
  its time (one token each, or ``goodput.tokens`` when the completion count says some
  carried more), so ITL is defined;
* otherwise ``SUMMARY`` detail from the attributes: emissions at TTFT and E2EL carrying 1 and
  n − 1 tokens (n = ``gen_ai.usage.completion_tokens``); one emission when n = 1, none when
  n = 0 (E2EL then comes from the finish phase).

Phases, when the attributes allow: queued = scheduled − time_in_queue, prefill start
(scheduled) = TTFT − time_in_model_prefill, prefill end = TTFT, finished = E2EL. Labels:
``model`` from ``gen_ai.request.model``, else ``gen_ai.response.model``, else the resource's
``service.name``; ``goodput.tenant`` etc. for the others. A span whose status is ERROR is
an ``ERROR`` record (its message as the reason).

Spans with another name are ignored (a collector may forward every trace). An
``llm_request`` span that cannot be mapped (a required attribute missing or not a number,
negative or inconsistent latencies, token events before the span start or out of order) is
rejected alone and reported in the response's ``partial_success``. Per-span work is
Python (the protobuf objects require it); token times are turned into offsets in one numpy
pass per request, not per token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Status as SpanStatus

from controlplane.ingest import otlp_attributes as attr
from controlplane.ingest.screen import MAX_REQUEST_S, MAX_TOKENS_PER_EMISSION
from exporters.records import (
    LABEL_KEYS,
    NUM_PHASES,
    LabelColumn,
    Phase,
    RecordBatch,
    Status,
    TokenDetail,
    Vantage,
)

__all__ = ["MAX_REPORTED_REASONS", "SpanMapping", "map_spans"]

#: How many rejection reasons the response's error_message quotes (the count is exact).
MAX_REPORTED_REASONS = 5
INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class SpanMapping:
    """The records mapped from one export request and what happened to its spans."""

    batch: RecordBatch
    num_spans: int
    num_ignored: int
    num_rejected: int
    reasons: tuple[str, ...]

    def rejecting(self, reasons: Sequence[str]) -> SpanMapping:
        """This mapping with ``reasons`` more rejected spans (refused after mapping)."""
        if not reasons:
            return self
        return replace(
            self, num_rejected=self.num_rejected + len(reasons), reasons=(*self.reasons, *reasons)
        )

    @property
    def error_message(self) -> str:
        """The first :data:`MAX_REPORTED_REASONS` reasons, for ``partial_success``."""
        if not self.num_rejected:
            return ""
        shown = "; ".join(self.reasons[:MAX_REPORTED_REASONS])
        more = self.num_rejected - min(len(self.reasons), MAX_REPORTED_REASONS)
        return f"{self.num_rejected} llm_request span(s) rejected: {shown}" + (
            f"; and {more} more" if more > 0 else ""
        )


@dataclass(slots=True)
class _Rows:
    """Columns of the records being built (lists; turned into arrays once)."""

    request_ids: list[str] = field(default_factory=list)
    arrival_ns: list[int] = field(default_factory=list)
    labels: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in LABEL_KEYS})
    status: list[int] = field(default_factory=list)
    reason: list[str] = field(default_factory=list)
    vantage: list[int] = field(default_factory=list)
    detail: list[int] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    phases: list[list[int]] = field(default_factory=list)
    num_emissions: list[int] = field(default_factory=list)
    emission_time_ns: list[int] = field(default_factory=list)  # absolute, Unix ns
    emission_tokens: list[int] = field(default_factory=list)
    span_index: list[int] = field(default_factory=list)


def _us(seconds: float) -> int:
    return round(seconds * 1e6)


def _phases(attrs: Mapping[str, Any], ttft_s: float | None, e2e_s: float | None) -> list[int]:
    """Phase offsets in µs (-1 absent) derived from vLLM's latency attributes."""
    phases = [-1] * NUM_PHASES
    if e2e_s is not None:
        phases[Phase.FINISHED] = _us(e2e_s)
    if ttft_s is None:
        return phases
    phases[Phase.PREFILL_END] = _us(ttft_s)
    prefill_s = attr.number(attrs, attr.ATTR_PREFILL)
    if prefill_s is None or not 0 <= prefill_s <= ttft_s:
        return phases
    scheduled_s = ttft_s - prefill_s
    phases[Phase.PREFILL_START] = _us(scheduled_s)
    queue_s = attr.number(attrs, attr.ATTR_QUEUE)
    if queue_s is not None and 0 <= queue_s <= scheduled_s:
        phases[Phase.QUEUED] = _us(scheduled_s - queue_s)
    return phases


def _status(span: Any, attrs: Mapping[str, Any]) -> tuple[Status, str]:
    name = attr.text(attrs, attr.ATTR_STATUS)
    if name:
        if name not in attr.STATUS_NAMES:
            raise ValueError(
                f"{attr.ATTR_STATUS} must be one of {list(attr.STATUS_NAMES)}, got {name!r}"
            )
        return attr.STATUS_NAMES[name], span.status.message[: attr.MAX_LABEL_CHARS]
    if span.status.code == SpanStatus.STATUS_CODE_ERROR:
        return Status.ERROR, span.status.message[: attr.MAX_LABEL_CHARS]
    return Status.OK, ""


def _vantage(attrs: Mapping[str, Any]) -> Vantage:
    name = attr.text(attrs, attr.ATTR_VANTAGE)
    if not name:
        return Vantage.ENGINE
    if name not in attr.VANTAGE_NAMES:
        raise ValueError(
            f"{attr.ATTR_VANTAGE} must be one of {list(attr.VANTAGE_NAMES)}, got {name!r}"
        )
    return attr.VANTAGE_NAMES[name]


def _token_events(span: Any, completion: float | None) -> tuple[list[int], list[int]]:
    """Times (Unix ns) and token counts of the span's token events.

    The per-token cost is one comprehension (name test, time read). Events are read again
    for their ``goodput.tokens`` only when ``completion`` (the span's completion tokens)
    differs from the number of events, i.e. when some event carries several tokens.
    """
    token = attr.TOKEN_EVENT
    events = span.events
    times = [e.time_unix_nano for e in events if e.name == token]
    if times and max(times) > INT64_MAX:
        raise ValueError(f"token event time_unix_nano must be below 2**63, got {max(times)}")
    if completion is None or completion == len(times):
        return times, [1] * len(times)
    return times, [_event_tokens(e) for e in events if e.name == token]


def _event_tokens(event: Any) -> int:
    for kv in event.attributes:
        if kv.key == attr.ATTR_EVENT_TOKENS:
            value = attr.value_of(kv.value)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 1 <= value <= MAX_TOKENS_PER_EMISSION
            ):
                raise ValueError(
                    f"event {attr.ATTR_EVENT_TOKENS} must be an int in "
                    f"[1, {MAX_TOKENS_PER_EMISSION}], got {value!r}"
                )
            return value
    return 1


def _summary_emissions(
    start_ns: int, ttft_s: float | None, e2e_s: float, n: int
) -> tuple[list[int], list[int]]:
    if n == 0:
        return [], []
    if ttft_s is None:
        raise ValueError(f"{attr.ATTR_TTFT} is missing for a request with {n} output tokens")
    first = start_ns + round(ttft_s * 1e9)
    if n == 1:
        return [first], [1]
    return [first, start_ns + round(e2e_s * 1e9)], [1, n - 1]


def _add_span(rows: _Rows, index: int, span: Any, service: str) -> None:
    """Append one llm_request span's record, or raise ValueError saying why it cannot be."""
    attrs = {kv.key: kv.value for kv in span.attributes}
    request_id = attr.text(attrs, attr.ATTR_REQUEST_ID) or span.span_id.hex()
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if not 0 < start <= INT64_MAX:
        raise ValueError(
            f"start_time_unix_nano must be set (it is the request's arrival) and below 2**63, "
            f"got {start}"
        )
    if end and end < start:
        raise ValueError(
            f"end_time_unix_nano {end} is before start_time_unix_nano {start} (a negative duration)"
        )
    ttft_s = attr.number(attrs, attr.ATTR_TTFT)
    e2e_s = attr.number(attrs, attr.ATTR_E2E)
    for key, value in ((attr.ATTR_TTFT, ttft_s), (attr.ATTR_E2E, e2e_s)):
        if value is not None and not 0 <= value <= MAX_REQUEST_S:
            raise ValueError(f"{key} must be in [0, {MAX_REQUEST_S}] seconds, got {value}")
    e2e_name = attr.ATTR_E2E
    if e2e_s is None and end >= start:
        # Without the attribute (a request that ended without a token), the span's
        # duration is the E2EL: producers end the span when the request finished.
        e2e_s = (end - start) / 1e9
        e2e_name = "the span's duration"
        if e2e_s > MAX_REQUEST_S:
            raise ValueError(f"the span lasts {e2e_s:g} s; at most {MAX_REQUEST_S} s allowed")
    if ttft_s is not None and e2e_s is not None and ttft_s > e2e_s:
        raise ValueError(f"{attr.ATTR_TTFT} {ttft_s} exceeds the E2EL {e2e_s} ({e2e_name})")
    completion = attr.number(attrs, attr.ATTR_COMPLETION_TOKENS)
    times, tokens = _token_events(span, completion)
    if times:
        detail = TokenDetail.FULL
    else:
        detail = TokenDetail.SUMMARY
        if e2e_s is None or completion is None:
            missing = attr.ATTR_E2E if e2e_s is None else attr.ATTR_COMPLETION_TOKENS
            raise ValueError(f"{missing} is missing (and the span has no token events)")
        if not 0 <= completion <= MAX_TOKENS_PER_EMISSION or not completion.is_integer():
            raise ValueError(
                f"{attr.ATTR_COMPLETION_TOKENS} must be an integer in "
                f"[0, {MAX_TOKENS_PER_EMISSION}], got {completion:g}"
            )
        times, tokens = _summary_emissions(
            span.start_time_unix_nano, ttft_s, e2e_s, int(completion)
        )
    prompt = attr.number(attrs, attr.ATTR_PROMPT_TOKENS) or 0.0
    if prompt < 0 or not prompt.is_integer() or prompt >= 2**31:
        raise ValueError(f"{attr.ATTR_PROMPT_TOKENS} must be an integer >= 0, got {prompt}")
    status, reason = _status(span, attrs)
    vantage = _vantage(attrs)
    if vantage is Vantage.ENGINE:
        # vLLM's id is ``cmpl-<X-Request-Id>-0``: the engine record joins the gateway's by
        # the client's id, as the stat-logger plugin's records do.
        request_id = attr.client_request_id(request_id)
    model = (
        attr.text(attrs, attr.ATTR_REQUEST_MODEL)
        or attr.text(attrs, attr.ATTR_RESPONSE_MODEL)
        or service
    )
    # Everything is checked: append the row (nothing above appended anything).
    rows.request_ids.append(request_id)
    rows.arrival_ns.append(span.start_time_unix_nano)
    rows.labels["model"].append(model)
    for key, attribute in attr.LABEL_ATTRIBUTES.items():
        rows.labels[key].append(attr.text(attrs, attribute))
    rows.status.append(status)
    rows.reason.append(reason)
    rows.vantage.append(vantage)
    rows.detail.append(detail)
    rows.prompt_tokens.append(int(prompt))
    rows.phases.append(_phases(attrs, ttft_s if detail is TokenDetail.SUMMARY else None, e2e_s))
    rows.num_emissions.append(len(times))
    rows.emission_time_ns.extend(times)
    rows.emission_tokens.extend(tokens)
    rows.span_index.append(index)


def _bad_rows(offsets_us: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Rows with an emission before arrival or emissions out of order (vectorised)."""
    n = starts.shape[0] - 1
    bad = np.zeros(n, dtype=np.bool_)
    if not offsets_us.shape[0]:
        return bad
    counts = np.diff(starts)
    row_of = np.repeat(np.arange(n), counts)
    np.logical_or.at(bad, row_of[offsets_us < 0], True)
    steps = np.diff(offsets_us) < 0
    same_row = row_of[1:] == row_of[:-1]
    np.logical_or.at(bad, row_of[1:][steps & same_row], True)
    return bad


def _to_batch(rows: _Rows) -> tuple[RecordBatch, np.ndarray]:
    n = len(rows.request_ids)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.asarray(rows.num_emissions, dtype=np.int64), out=starts[1:])
    counts = np.diff(starts)
    arrival_ns = np.asarray(rows.arrival_ns, dtype=np.int64)
    times_ns = np.asarray(rows.emission_time_ns, dtype=np.int64)
    offsets_us = (times_ns - np.repeat(arrival_ns, counts)) // 1000
    bad = _bad_rows(offsets_us, starts)
    batch = RecordBatch(
        request_ids=rows.request_ids,
        vantage=np.asarray(rows.vantage, dtype=np.uint8),
        arrival_time_ns=arrival_ns,
        labels={k: LabelColumn.encode(v) for k, v in rows.labels.items()},
        status=np.asarray(rows.status, dtype=np.uint8),
        reason=LabelColumn.encode(rows.reason),
        final=np.ones(n, dtype=np.bool_),
        token_detail=np.asarray(rows.detail, dtype=np.uint8),
        phase_offsets_us=np.asarray(rows.phases, dtype=np.int64).reshape(n, NUM_PHASES),
        kv_bytes=np.zeros(n, dtype=np.int64),
        prompt_tokens=np.asarray(rows.prompt_tokens, dtype=np.int32),
        cached_tokens=np.zeros(n, dtype=np.int32),
        emission_starts=starts,
        emission_offsets_us=np.maximum(offsets_us, 0),
        emission_tokens=np.asarray(rows.emission_tokens, dtype=np.int32),
    )
    return batch, bad


def map_spans(request: ExportTraceServiceRequest) -> SpanMapping:
    """The records of every mappable ``llm_request`` span of ``request`` (module doc)."""
    rows = _Rows()
    reasons: list[str] = []
    num_spans = num_ignored = 0
    for resource_spans in request.resource_spans:
        service = ""
        for kv in resource_spans.resource.attributes:
            if kv.key == attr.SERVICE_NAME:
                value = attr.value_of(kv.value)
                service = value[: attr.MAX_LABEL_CHARS] if isinstance(value, str) else ""
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                index = num_spans
                num_spans += 1
                if span.name != attr.LLM_SPAN_NAME:
                    num_ignored += 1
                    continue
                try:
                    _add_span(rows, index, span, service)
                except (ValueError, OverflowError) as exc:
                    reasons.append(f"span {index} ({span.span_id.hex() or 'no id'}): {exc}")
    batch, bad = _to_batch(rows)
    if bad.any():
        for row in np.flatnonzero(bad).tolist():
            reasons.append(
                f"span {rows.span_index[row]} (request {rows.request_ids[row]!r}): token "
                "events must be at or after the span start and in time order"
            )
        batch = batch.take(~bad)
    return SpanMapping(
        batch=batch,
        num_spans=num_spans,
        num_ignored=num_ignored,
        num_rejected=len(reasons),
        reasons=tuple(reasons),
    )
