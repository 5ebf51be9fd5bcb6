"""Engine-vantage records of a sim worker, built by the vLLM plugin's own builder.

A vLLM worker ships one ``ENGINE`` record per finished request from its stat-logger
plugin (:mod:`serving.vllm_plugin`); a sim worker ships the same records, built by the
same :class:`~serving.vllm_plugin.records.EngineRecordBuilder` from what vLLM would have
reported: each first token (its iteration's time, the TTFT and the prompt tokens that
arrived by KV transfer) and each finished request (end-to-end latency, queued, prefill
and decode times, token counts, finish reason), all from the modelled schedule placed on
the wall clock (virtual 0 = the wall time the engine started). Request ids are the
``x-request-id`` each leg was sent with, so the gateway's record joins the decode leg's
and ``<id>-prefill`` names the prefill leg's.

A decode leg whose prompt's KV cache came from another worker carries ``kv_bytes`` (its
prompt tokens × the model's KV bytes per token, as the plugin computes it). The worker's own
KV metrics (``kv_sink``: a :class:`~exporters.prometheus.KVTransferExporter` on its
``/metrics``) get a copy of that record whose only phases are ``KV_HANDOFF_START`` at its
arrival (the fetch starts at once), ``KV_HANDOFF_END`` when the modelled transfer landed
(:meth:`~serving.sim.worker.engine.SimEngine.transfer_s` over the worker's link) and
``FINISHED``. The record shipped to the control plane keeps the plugin's phases only, as a
vLLM worker's: there ``KV_HANDOFF_*`` means the gateway's hand-off (prefill answered →
decode's first token), which the admission learner reads, and the ingest screen wants the
phases in order, which an engine-side transfer before the first token would break.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from exporters.records import NUM_PHASES, Phase
from exporters.sinks import RecordSink
from serving.sim.worker.engine import SimEngine, SimRequest
from serving.vllm_plugin.records import EngineRecordBuilder

__all__ = ["EngineRecords"]


@dataclass(frozen=True, slots=True)
class _Finished:
    """The fields of vLLM's ``FinishedRequestStats`` the builder reads."""

    request_id: str
    finish_reason: str
    e2e_latency: float
    queued_time: float
    prefill_time: float
    decode_time: float
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int


def _or(value: float, default: float) -> float:
    return default if math.isnan(value) else value


class EngineRecords:
    """Listens to ``engine`` and hands its records to ``exporter`` (a
    :class:`~exporters.transport.ControlPlaneExporter` in the worker; ``None``: none) and,
    with the hand-off phases, to ``kv_sink`` (see the module docstring); install with
    :meth:`attach`."""

    def __init__(
        self,
        engine: SimEngine,
        exporter: RecordSink | None,
        *,
        model: str,
        kv_sink: RecordSink | None = None,
    ) -> None:
        self.engine = engine
        self.exporter = exporter
        self.kv_sink = kv_sink
        self.builder = EngineRecordBuilder(
            model=model, kv_bytes_per_token=engine.kv_bytes_per_token
        )

    def attach(self) -> EngineRecords:
        self.engine.listener = self
        return self

    def first_token(self, request: SimRequest, at_s: float) -> None:
        self.builder.observe_first_tokens(
            self.engine.wall_at_zero_s + at_s, [at_s - request.arrival_s],
            request.external_tokens,
        )  # fmt: skip

    def finished(self, request: SimRequest, at_s: float) -> None:
        job = request.job
        first = request.first_token_s if request.seen else at_s
        queued = _or(job.queued_s, request.arrival_s)
        start = _or(job.prefill_start_s, first)
        end = _or(job.prefill_end_s, start)
        finished = _Finished(
            request_id=request.request_id,
            finish_reason=request.finish_reason,
            e2e_latency=at_s - request.arrival_s,
            queued_time=max(0.0, start - queued),
            prefill_time=max(0.0, end - start),
            decode_time=max(0.0, at_s - first),
            num_prompt_tokens=job.prompt_tokens,
            num_generation_tokens=request.seen,
            num_cached_tokens=request.cached_tokens,
        )
        record = self.builder.build(finished, self.engine.wall_at_zero_s + at_s)
        if self.exporter is not None:
            self.exporter.export(record)
        if self.kv_sink is not None and request.external_tokens and math.isfinite(job.kv_end_s):
            phases = np.full(NUM_PHASES, -1, dtype=np.int64)
            phases[Phase.KV_HANDOFF_START] = 0
            phases[Phase.KV_HANDOFF_END] = round(max(0.0, job.kv_end_s - request.arrival_s) * 1e6)
            phases[Phase.FINISHED] = record.phase_offsets_us[Phase.FINISHED]
            self.kv_sink.export(replace(record, phase_offsets_us=phases))
