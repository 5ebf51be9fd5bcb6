"""Request metrics and spans for OpenTelemetry, in the shapes existing pipelines read.

:class:`OTelExporter` is a :class:`~exporters.sinks.RecordSink` over a ``MeterProvider``
(and optionally a ``TracerProvider``) passed in — never the global ones. It records the
GenAI semantic-convention server metrics, histograms in seconds with explicit bucket advice
from :mod:`exporters.buckets`:

* ``gen_ai.server.time_to_first_token`` — TTFT of successful requests;
* ``gen_ai.server.time_per_output_token`` — TPOT of successful requests;
* ``gen_ai.server.request.duration`` — E2EL of every finished request, with ``error.type``
  (``error``, ``aborted``, ``rejected``) on the ones that did not succeed;

with attributes ``gen_ai.operation.name``, ``gen_ai.provider.name``,
``gen_ai.request.model`` and ``goodput.vantage``. With a tracer provider it also emits one
span per request named ``llm_request`` (kind ``SERVER``), from arrival to finish, with the
attributes vLLM's own request span carries (``gen_ai.latency.time_to_first_token``,
``gen_ai.latency.e2e``, ``gen_ai.latency.time_in_queue``,
``gen_ai.latency.time_in_model_prefill``, ``…_decode``, ``…_inference`` in seconds,
``gen_ai.usage.prompt_tokens``, ``gen_ai.usage.completion_tokens``, ``gen_ai.request.id``),
so a pipeline built for vLLM reads ours unchanged. vLLM's phase definitions are kept: queue
= scheduled − queued, prefill = first token − scheduled, decode = last − first token,
inference = last token − scheduled, where "scheduled" is our ``PREFILL_START``.

Latencies come from :func:`exporters.latency.request_latencies`, computed per batch of
records: ``export`` appends to a list, and the list is folded into the instruments every
``fold_every`` records, when the oldest waits longer than ``max_delay_s``, on
``force_flush``, and just before each metric collection (an observable instrument's
callback, which the SDK runs ahead of reading the histograms).

Example::

    exporter = OTelExporter(meter_provider, tracer_provider)
    recorder = RequestRecorder(Vantage.ENGINE, exporter)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import numpy.typing as npt
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import SpanKind, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from exporters._fold import FoldingSink, RecordFolder
from exporters.buckets import LATENCY_BUCKETS_S, validate_buckets
from exporters.latency import RequestLatencies, request_latencies
from exporters.records import Phase, RecordBatch, Status, Vantage

__all__ = ["SPAN_NAME", "OTelExporter"]

logger = logging.getLogger(__name__)

F64 = npt.NDArray[np.float64]
Attributes = dict[str, AttributeValue]

SPAN_NAME = "llm_request"
_SCOPE = "goodput.exporters"
_US_PER_S = 1e6
_MAX_CACHED_ATTRIBUTE_SETS = 4096


class OTelExporter(FoldingSink):
    """GenAI server metrics (and optionally vLLM-shaped spans) of the records it receives.

    ``export`` never raises; a record that breaks the contract is left out, logged once and
    counted in :attr:`num_invalid_records`. ``force_flush`` folds pending records and then
    flushes the providers that support it; ``shutdown`` folds and stops accepting records
    but leaves the providers, which belong to the caller, running.
    """

    def __init__(
        self,
        meter_provider: MeterProvider,
        tracer_provider: TracerProvider | None = None,
        *,
        buckets: Sequence[float] = LATENCY_BUCKETS_S,
        operation_name: str = "chat",
        provider_name: str = "vllm",
        fold_every: int = 256,
        max_delay_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        bounds = list(validate_buckets(list(buckets)))
        self._folder = RecordFolder(
            self._record,
            destination="OpenTelemetry metrics",
            logger=logger,
            fold_every=fold_every,
            max_delay_s=max_delay_s,
            clock=clock,
        )
        self._meter_provider = meter_provider
        self._tracer_provider = tracer_provider
        self._base: Attributes = {
            "gen_ai.operation.name": operation_name,
            "gen_ai.provider.name": provider_name,
        }
        meter = meter_provider.get_meter(_SCOPE)
        self._ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token",
            unit="s",
            description="Time to generate first token for successful responses.",
            explicit_bucket_boundaries_advisory=bounds,
        )
        self._tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token",
            unit="s",
            description="Time per output token generated after the first token for "
            "successful responses.",
            explicit_bucket_boundaries_advisory=bounds,
        )
        self._duration = meter.create_histogram(
            "gen_ai.server.request.duration",
            unit="s",
            description="Generative AI server request duration: arrival to last output token.",
            explicit_bucket_boundaries_advisory=bounds,
        )
        # Never reports a value: its callback runs at the start of every collection, which
        # is when pending records must reach the histograms.
        meter.create_observable_gauge(
            "goodput.exporter.otel_fold",
            callbacks=[self._before_collect],
            description="Internal: folds pending request records before each collection.",
        )
        self._tracer = None if tracer_provider is None else tracer_provider.get_tracer(_SCOPE)
        self._attrs: dict[tuple[str, int, int], Attributes] = {}

    # -- RecordSink (export, shutdown: FoldingSink) --

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        self._folder.fold()
        ok = True
        for provider in (self._meter_provider, self._tracer_provider):
            flush = getattr(provider, "force_flush", None)
            if flush is not None:  # the SDK providers have it; the API's no-op ones do not
                ok = bool(flush(timeout_millis=max(0, int(timeout_s * 1000)))) and ok
        return ok

    # -- folding --

    def _before_collect(self, options: CallbackOptions) -> Iterable[Observation]:
        self._folder.fold()
        return ()

    def _record(self, batch: RecordBatch) -> None:
        lat = request_latencies(batch, validate=False)
        self._record_metrics(batch, lat)
        if self._tracer is not None:
            self._emit_spans(batch, lat)

    def _attributes(self, model: str, vantage: int, status: int) -> Attributes:
        """Per label set, built once: the SDK keys its series by these attribute sets."""
        key = (model, vantage, status)
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = {**self._base, "goodput.vantage": Vantage(vantage).name.lower()}
            if model:
                attrs["gen_ai.request.model"] = model
            if status != Status.OK:
                attrs["error.type"] = Status(status).name.lower()
            if len(self._attrs) < _MAX_CACHED_ATTRIBUTE_SETS:  # client-chosen models: bounded
                self._attrs[key] = attrs
        return attrs

    def _record_metrics(self, batch: RecordBatch, lat: RequestLatencies) -> None:
        models = batch.labels["model"].decode()
        vantages = batch.vantage.tolist()
        statuses = batch.status.tolist()
        ttft, tpot, e2el = lat.ttft_s.tolist(), lat.tpot_s.tolist(), lat.e2el_s.tolist()
        for i, status in enumerate(statuses):  # per request; NaN != NaN marks "undefined"
            attrs = self._attributes(models[i], vantages[i], status)
            if status == Status.OK:
                if ttft[i] == ttft[i]:
                    self._ttft.record(ttft[i], attrs)
                if tpot[i] == tpot[i]:
                    self._tpot.record(tpot[i], attrs)
            if e2el[i] == e2el[i]:
                self._duration.record(e2el[i], attrs)

    def _emit_spans(self, batch: RecordBatch, lat: RequestLatencies) -> None:
        assert self._tracer is not None
        phases_s = np.where(batch.phase_offsets_us >= 0, batch.phase_offsets_us / _US_PER_S, np.nan)
        scheduled = phases_s[:, Phase.PREFILL_START]
        queued = np.where(np.isnan(phases_s[:, Phase.QUEUED]), 0.0, phases_s[:, Phase.QUEUED])
        # vLLM's definitions (see the module docstring); NaN propagates "undefined".
        columns: dict[str, F64] = {
            "gen_ai.latency.time_to_first_token": lat.ttft_s,
            "gen_ai.latency.e2e": lat.e2el_s,
            "gen_ai.latency.time_in_queue": scheduled - queued,
            "gen_ai.latency.time_in_model_prefill": lat.ttft_s - scheduled,
            "gen_ai.latency.time_in_model_decode": lat.e2el_s - lat.ttft_s,
            "gen_ai.latency.time_in_model_inference": lat.e2el_s - scheduled,
        }
        values = {name: column.tolist() for name, column in columns.items()}
        # The span ends at the recorded finish, else at the last token (E2EL), else at arrival.
        end_s = np.fmax(phases_s[:, Phase.FINISHED], np.nan_to_num(lat.e2el_s, nan=0.0))
        end_ns = (batch.arrival_time_ns + np.rint(end_s * 1e9).astype(np.int64)).tolist()
        start_ns = batch.arrival_time_ns.tolist()
        models = batch.labels["model"].decode()
        slos = batch.labels["slo"].decode()
        reasons = batch.reason.decode()
        prompt = batch.prompt_tokens.tolist()
        output = lat.output_tokens.tolist()
        statuses = batch.status.tolist()
        vantages = batch.vantage.tolist()
        root = Context()  # a span of its own trace, whatever span is current on this thread
        for i, request_id in enumerate(batch.request_ids):
            attrs: Attributes = {
                "gen_ai.request.id": request_id,
                "gen_ai.usage.prompt_tokens": prompt[i],
                "gen_ai.usage.completion_tokens": output[i],
                "goodput.vantage": Vantage(vantages[i]).name.lower(),
                "goodput.status": Status(statuses[i]).name.lower(),
            }
            if models[i]:
                attrs["gen_ai.request.model"] = models[i]
            if slos[i]:
                attrs["goodput.slo"] = slos[i]
            for name, column in values.items():
                if column[i] == column[i]:
                    attrs[name] = column[i]
            span = self._tracer.start_span(
                SPAN_NAME,
                context=root,
                kind=SpanKind.SERVER,
                attributes=attrs,
                start_time=start_ns[i],
            )
            if statuses[i] == Status.ERROR:
                span.set_status(StatusCode.ERROR, reasons[i] or None)
            span.end(end_time=end_ns[i])
