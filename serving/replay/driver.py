"""Replay a request trace in real time: arrivals paced by a rate schedule, token times from
the closed-form :class:`~serving.replay.latency_model.ReplayLatencyModel`, one
:class:`~exporters.records.RequestRecord` per request handed to a
:class:`~exporters.sinks.RecordSink` at the request's finish time.

The records are what a gateway would have measured (vantage ``GATEWAY``, every token, so
``FULL`` detail) with labels ``model``, ``tenant`` and ``priority``; judging them is the
control plane's job. The trace repeats (cycle after cycle) for as long as the replay runs;
requests still in flight when it stops are not reported.

Example::

    exporter = ControlPlaneExporter("http://127.0.0.1:8000", api_key=ingest_key)
    driver = ReplayDriver(load_trace("azure_conv"), exporter, schedule=RampSchedule())
    stats = driver.run(threading.Event(), duration_s=60.0)
    exporter.shutdown(timeout_s=5.0)
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from exporters.records import Labels, Phase, RequestRecord, Status, TokenDetail, Vantage
from exporters.sinks import RecordSink
from serving.replay.latency_model import ModelParams, ReplayLatencyModel, RequestTimings
from serving.traces import Trace

__all__ = [
    "DEFAULT_MODEL",
    "PRIORITIES",
    "TENANTS",
    "RampSchedule",
    "ReplayDriver",
    "ReplayStats",
    "build_record",
]

F64 = npt.NDArray[np.float64]
DEFAULT_MODEL = "llama-3.1-8b"
#: Label values drawn per request (seeded), with their shares of the traffic.
TENANTS: tuple[tuple[str, float], ...] = (("acme", 0.5), ("globex", 0.3), ("initech", 0.2))
PRIORITIES: tuple[tuple[str, float], ...] = (("interactive", 0.8), ("batch", 0.2))


@dataclass(frozen=True, slots=True)
class RampSchedule:
    """How fast the trace is replayed: a rate scale that ramps linearly from ``low`` to
    ``high`` over the first half of each ``period_s`` and back over the second half, so a
    run shows the same system both under and over its capacity. ``low == high`` replays
    at a constant scale. ``trace_time`` maps wall seconds since the start to trace
    seconds (the integral of the scale) and ``wall_time`` inverts it, both vectorised.
    """

    low: float = 1.0
    high: float = 5.0
    period_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("low", "high", "period_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.high < self.low:
            raise ValueError(f"high must be >= low ({self.low!r}), got {self.high!r}")

    @property
    def _slope(self) -> float:  # scale per wall second while ramping
        return (self.high - self.low) / (self.period_s / 2)

    def scale_at(self, wall_s: float) -> float:
        u = wall_s % self.period_s
        return self.low + self._slope * min(u, self.period_s - u)

    def trace_time(self, wall_s: F64) -> F64:
        half, k, low, high = self.period_s / 2, self._slope, self.low, self.high
        cycles, u = np.divmod(np.asarray(wall_s, dtype=np.float64), self.period_s)
        v = u - half
        rising = low * u + k * u * u / 2
        falling = half * (low + high) / 2 + high * v - k * v * v / 2
        trace: F64 = cycles * half * (low + high) + np.where(u <= half, rising, falling)
        return trace

    def wall_time(self, trace_s: F64) -> F64:
        half, k, low, high = self.period_s / 2, self._slope, self.low, self.high
        per_cycle, rise = half * (low + high), half * (low + high) / 2
        cycles, r = np.divmod(np.asarray(trace_s, dtype=np.float64), per_cycle)
        # Roots of the two quadratics in the stable form 2c / (b + sqrt(b² ± 4ac)).
        up = 2 * r / (low + np.sqrt(low * low + 2 * k * r))
        down_r = np.maximum(r - rise, 0.0)
        down = half + 2 * down_r / (high + np.sqrt(np.maximum(high * high - 2 * k * down_r, 0)))
        wall: F64 = cycles * self.period_s + np.where(r <= rise, up, down)
        return wall


@dataclass(frozen=True, slots=True)
class ReplayStats:
    """Progress of a replay: ``elapsed_s`` since its start, requests arrived and reported
    (``num_exported``), those in flight in the model, and the rate scale now."""

    elapsed_s: float
    num_arrived: int
    num_exported: int
    num_in_flight: int
    rate_scale: float


def build_record(
    timings: RequestTimings,
    *,
    request_id: str,
    start_time_ns: int,
    labels: Labels,
    prompt_tokens: int,
    kv_bytes: int,
) -> RequestRecord:
    """The gateway's record of one modelled request; model time 0 is ``start_time_ns``."""
    arrival_s = timings.arrival_s

    def us(at_s: float) -> int:
        return round((at_s - arrival_s) * 1e6)

    offsets = np.rint((timings.emission_s - arrival_s) * 1e6).astype(np.int64)
    phases = np.full(len(Phase), -1, dtype=np.int64)
    phases[Phase.QUEUED] = 0
    phases[Phase.PREFILL_START] = us(timings.prefill_start_s)
    phases[Phase.PREFILL_END] = phases[Phase.KV_HANDOFF_START] = us(timings.prefill_end_s)
    phases[Phase.KV_HANDOFF_END] = us(timings.kv_end_s)
    phases[Phase.FINISHED] = int(offsets[-1])
    return RequestRecord(
        request_id=request_id,
        vantage=Vantage.GATEWAY,
        arrival_time_ns=start_time_ns + round(arrival_s * 1e9),
        labels=labels,
        emission_offsets_us=offsets,
        token_detail=TokenDetail.FULL,
        phase_offsets_us=phases,
        kv_bytes=kv_bytes,
        prompt_tokens=prompt_tokens,
        status=Status.OK,
    )


class ReplayDriver:
    """Replays ``trace`` into ``sink`` in real time (see the module).

    :meth:`poll` does one tick's work for a time since the start (it is what tests call
    with a fake clock); :meth:`run` calls it every ``tick_s`` until ``stop`` is set or
    ``duration_s`` has passed. Everything random (label draws, the model's jitter) comes
    from ``seed``. Not thread-safe: one thread polls; :meth:`stats` may be read from any.
    """

    def __init__(
        self,
        trace: Trace,
        sink: RecordSink,
        *,
        schedule: RampSchedule | None = None,
        params: ModelParams | None = None,
        seed: int = 0,
        model_name: str = DEFAULT_MODEL,
        start_time_ns: int | None = None,
        run_id: str | None = None,
    ) -> None:
        if len(trace) == 0:
            raise ValueError(f"trace {trace.name!r} has no requests to replay")
        self.trace = trace
        self.sink = sink
        self.schedule = schedule or RampSchedule()
        self.model = ReplayLatencyModel(params, seed=seed)
        self.model_name = model_name
        self.start_time_ns = time.time_ns() if start_time_ns is None else start_time_ns
        self.run_id = run_id or uuid.uuid4().hex[:8]
        # One trace cycle lasts its span plus one mean gap, so cycles do not overlap.
        self.cycle_s = trace.duration_s + trace.duration_s / max(1, len(trace) - 1) or 1.0
        self._rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[2])
        self._cycle = -1
        self._cycle_wall_s: F64 = np.zeros(0)
        self._cycle_tenant = np.zeros(0, dtype=np.int64)
        self._cycle_priority = np.zeros(0, dtype=np.int64)
        self._row = 0  # next row of the current cycle to submit
        self._num_submitted = 0
        self._pending: dict[int, tuple[int, int, int]] = {}  # index -> (row, tenant, prio)
        self._lock = threading.Lock()
        self._stats = ReplayStats(0.0, 0, 0, 0, self.schedule.scale_at(0.0))

    def stats(self) -> ReplayStats:
        with self._lock:
            return self._stats

    def poll(self, now_s: float) -> int:
        """Submit the arrivals up to ``now_s`` and export the requests finished by then;
        the number exported. ``now_s`` (seconds since the start) must not go back."""
        while True:
            if self._row >= self._cycle_wall_s.shape[0]:
                self._next_cycle()
            hi = int(np.searchsorted(self._cycle_wall_s, now_s, side="right"))
            if hi > self._row:
                self._submit(self._row, hi)
            if hi < self._cycle_wall_s.shape[0]:
                break
        exported = 0
        for timings in self.model.advance(now_s):
            self.sink.export(self._record(timings))
            exported += 1
        with self._lock:
            old = self._stats
            self._stats = ReplayStats(
                elapsed_s=now_s,
                num_arrived=self._num_submitted,
                num_exported=old.num_exported + exported,
                num_in_flight=len(self._pending),
                rate_scale=self.schedule.scale_at(now_s),
            )
        return exported

    def run(
        self,
        stop: threading.Event,
        duration_s: float | None = None,
        *,
        tick_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> ReplayStats:
        """Poll every ``tick_s`` until ``stop`` is set or ``duration_s`` has passed."""
        t0 = clock()
        while not stop.is_set():
            now_s = clock() - t0
            if duration_s is not None and now_s >= duration_s:
                self.poll(duration_s)
                break
            self.poll(now_s)
            stop.wait(tick_s)
        return self.stats()

    def _next_cycle(self) -> None:
        self._cycle += 1
        trace_s = self._cycle * self.cycle_s + self.trace.arrival_s
        self._cycle_wall_s = self.schedule.wall_time(trace_s)
        n = len(self.trace)
        self._cycle_tenant = self._draw(TENANTS, n)
        self._cycle_priority = self._draw(PRIORITIES, n)
        self._row = 0

    def _draw(self, choices: tuple[tuple[str, float], ...], n: int) -> npt.NDArray[np.int64]:
        shares = np.array([share for _, share in choices])
        codes: npt.NDArray[np.int64] = self._rng.choice(len(choices), size=n, p=shares)
        return codes

    def _submit(self, lo: int, hi: int) -> None:
        trace = self.trace
        self.model.submit(
            self._cycle_wall_s[lo:hi], trace.input_tokens[lo:hi], trace.output_tokens[lo:hi]
        )
        tenants = self._cycle_tenant[lo:hi].tolist()
        priorities = self._cycle_priority[lo:hi].tolist()
        for k, row in enumerate(range(lo, hi)):
            self._pending[self._num_submitted + k] = (row, tenants[k], priorities[k])
        self._num_submitted += hi - lo
        self._row = hi

    def _record(self, timings: RequestTimings) -> RequestRecord:
        row, tenant, priority = self._pending.pop(timings.index)
        prompt_tokens = int(self.trace.input_tokens[row])
        return build_record(
            timings,
            request_id=f"{self.run_id}-{timings.index:08d}",
            start_time_ns=self.start_time_ns,
            labels=Labels(
                model=self.model_name, tenant=TENANTS[tenant][0], priority=PRIORITIES[priority][0]
            ),
            prompt_tokens=prompt_tokens,
            kv_bytes=prompt_tokens * self.model.params.kv_bytes_per_token,
        )
