"""The per-token recorder: one :class:`RequestTrace` per request, timestamps into a buffer.

Gateways and engine plugins call :meth:`RequestRecorder.start` when a request arrives,
:meth:`RequestTrace.token` for every token (or :meth:`RequestTrace.tokens` for a chunk of
``k``), :meth:`RequestTrace.mark` at phase boundaries and :meth:`RequestTrace.finish` at
the end, which turns the trace into a :class:`~exporters.records.RequestRecord` and hands
it to the sink.

Hot path. ``token()`` reads the monotonic clock and stores the integer at the next index
of a preallocated int64 buffer (a ``memoryview`` cast to ``'q'`` over a ``bytearray``): no
allocation, lock, log, dict lookup or label resolution. Of the designs measured
(``benchmarks/exporter_overhead.py``, docs/exporters.md) it is the fastest that keeps no
object per token — a few percent ahead of ``array('q')``, whose item assignment goes
through ``PyArg_Parse`` — numpy reads it without a copy, and the buffer is reused by the
next request. Outgrowing a buffer doubles it (rare; counted).
Times become µs offsets after arrival once, in numpy, at ``finish``/``snapshot``.

Threads. ``token``/``tokens``/``mark`` of one trace are called by the code serving its
request, one call at a time; ``start``, ``finish`` and ``partial_records`` may run on any
thread.

Example::

    recorder = RequestRecorder(Vantage.GATEWAY, sink)
    trace = recorder.start("req-1", Labels(model="llama"))
    for chunk in stream:
        trace.tokens(len(chunk.token_ids))
    record = trace.finish()
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from exporters.records import NUM_PHASES, Labels, Phase, RequestRecord, Status, Vantage
from exporters.sinks import RecordSink

__all__ = ["RecorderStats", "RequestRecorder", "RequestTrace"]

logger = logging.getLogger(__name__)

NO_LABELS = Labels()
# A zero-length buffer swapped in at finish: a late token() then fails its store with
# IndexError and lands in the slow path, which counts it, without a check on the hot path.
_SEALED = memoryview(bytearray()).cast("q")
_ABSENT = -1


@dataclass(frozen=True, slots=True)
class RecorderStats:
    """Counters of a :class:`RequestRecorder` since it was made."""

    num_started: int
    num_finished: int
    num_in_flight: int
    num_buffer_growths: int  # a request outgrew its buffer and it was doubled
    num_buffers_reused: int  # start() took a buffer from the free list
    num_late_events: int  # token()/mark() on a finished trace, ignored
    num_sink_errors: int  # the sink raised from export() (it should never)


class RequestRecorder:
    """Makes :class:`RequestTrace` objects and hands their records to a sink.

    ``clock_ns`` is the monotonic clock token times are read from; ``wall_clock_ns`` the
    wall clock read once per request for ``arrival_time_ns``. ``initial_capacity`` is the
    number of emissions a buffer holds before it grows. With ``partial_interval_s`` set,
    :meth:`partial_records` returns partial records of long-running requests.
    """

    def __init__(
        self,
        vantage: Vantage,
        sink: RecordSink,
        *,
        clock_ns: Callable[[], int] = time.perf_counter_ns,
        wall_clock_ns: Callable[[], int] = time.time_ns,
        initial_capacity: int = 1024,
        partial_interval_s: float | None = None,
        max_free_buffers: int = 256,
    ) -> None:
        if initial_capacity < 1:
            raise ValueError(f"initial_capacity must be >= 1, got {initial_capacity}")
        if partial_interval_s is not None and not partial_interval_s > 0:
            raise ValueError(f"partial_interval_s must be > 0 or None, got {partial_interval_s}")
        if max_free_buffers < 0:
            raise ValueError(f"max_free_buffers must be >= 0, got {max_free_buffers}")
        self.vantage = Vantage(vantage)
        self.sink = sink
        self.clock_ns = clock_ns
        self.wall_clock_ns = wall_clock_ns
        self.initial_capacity = initial_capacity
        self.partial_interval_s = partial_interval_s
        self._partial_interval_ns = (
            None if partial_interval_s is None else round(partial_interval_s * 1e9)
        )
        self._max_free = max_free_buffers
        self._lock = threading.Lock()
        self._free: list[memoryview] = []
        self._live: dict[RequestTrace, None] = {}  # insertion-ordered
        self._sink_failed = False
        # RecorderStats fields without their num_ prefix (but the derived num_in_flight).
        self._counters = dict.fromkeys(
            ("started", "finished", "buffer_growths", "buffers_reused", "late_events",
             "sink_errors"), 0
        )  # fmt: skip

    def start(
        self,
        request_id: str,
        labels: Labels = NO_LABELS,
        *,
        arrival_ts_ns: int | None = None,
        expected_tokens: int | None = None,
    ) -> RequestTrace:
        """Begin recording a request.

        ``arrival_ts_ns`` (on ``clock_ns``) backdates the arrival, for a request received
        before the recorder saw it; it must not be in the future. ``expected_tokens``
        sizes the buffer for a long request up front, so it never grows.
        """
        now = self.clock_ns()
        if arrival_ts_ns is None:
            arrival_ts_ns = now
        elif arrival_ts_ns > now:
            raise ValueError(
                f"arrival_ts_ns must not be in the future of clock_ns, got {arrival_ts_ns} "
                f"> now {now}"
            )
        if expected_tokens is not None and expected_tokens < 0:
            raise ValueError(f"expected_tokens must be >= 0, got {expected_tokens}")
        arrival_time_ns = self.wall_clock_ns() - (now - arrival_ts_ns)
        want = self.initial_capacity
        if expected_tokens is not None and expected_tokens > want:
            want = expected_tokens
        with self._lock:
            self._counters["started"] += 1
            buf = self._free.pop() if want == self.initial_capacity and self._free else None
            self._counters["buffers_reused"] += buf is not None
        buf = _zeros(want) if buf is None else buf
        arrival = (arrival_ts_ns, arrival_time_ns)
        trace = RequestTrace(self, request_id, labels=labels, buf=buf, arrival=arrival)
        if self._partial_interval_ns is not None:
            with self._lock:
                self._live[trace] = None
        return trace

    def partial_records(self) -> list[RequestRecord]:
        """Partial records (``final=False``, status ``IN_FLIGHT``) of in-flight requests whose
        last partial (or start) is at least ``partial_interval_s`` old.

        Per request, never per token; the owner calls it on its own schedule (a timer) and
        exports what it returns. Each record carries the whole state so far.
        """
        interval = self._partial_interval_ns
        if interval is None:
            raise ValueError(
                "partial_records: partial_interval_s is None; build the recorder with "
                "partial_interval_s > 0 to track in-flight requests"
            )
        now = self.clock_ns()
        out: list[RequestRecord] = []
        # Under the lock a live trace cannot finish, so its buffer cannot be recycled while
        # it is read here.
        with self._lock:
            for trace in self._live:
                # A trace finishing right now is sealed before it leaves the live set.
                if trace._record is None and now - trace._last_partial_ts >= interval:
                    trace._last_partial_ts = now
                    out.append(trace._build(Status.IN_FLIGHT, "", final=False))
        return out

    def stats(self) -> RecorderStats:
        with self._lock:
            counters = dict(self._counters)
        return RecorderStats(
            num_in_flight=counters["started"] - counters["finished"],
            **{f"num_{name}": value for name, value in counters.items()},
        )

    # -- called by RequestTrace (per request or on rare paths, never per token) --

    def _finished(self, trace: RequestTrace, buf: memoryview) -> None:
        with self._lock:
            self._counters["finished"] += 1
            self._live.pop(trace, None)
            if len(buf) == self.initial_capacity and len(self._free) < self._max_free:
                self._free.append(buf)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counters[name] += 1

    def _export(self, record: RequestRecord) -> None:
        try:
            self.sink.export(record)
        except Exception:
            with self._lock:
                self._counters["sink_errors"] += 1
                first = not self._sink_failed
                self._sink_failed = True
            if first:  # de-duplicated: a broken sink fails on every request
                logger.exception(
                    "record sink %r raised from export(); counting further errors", self.sink
                )


class RequestTrace:
    """What the recorder knows of one request so far. Made by :meth:`RequestRecorder.start`.

    ``token()`` is the hot path; ``finish()`` seals the trace (idempotent) and hands the
    record to the sink. Calls on a finished trace are ignored and counted as late.
    """

    __slots__ = (
        "_buf", "_clock", "_counts", "_last_partial_ts", "_n", "_phases", "_record",
        "_recorder", "arrival_time_ns", "arrival_ts_ns", "cached_tokens", "kv_bytes",
        "labels", "prompt_tokens", "request_id",
    )  # fmt: skip

    def __init__(
        self,
        recorder: RequestRecorder,
        request_id: str,
        *,
        labels: Labels,
        buf: memoryview,
        arrival: tuple[int, int],  # (monotonic arrival_ts_ns, wall-clock arrival_time_ns)
    ) -> None:
        self._recorder = recorder
        self._clock = recorder.clock_ns
        self._buf = buf
        self._n = 0
        self._counts: array[int] | None = None
        self._phases = [_ABSENT] * NUM_PHASES
        self._record: RequestRecord | None = None
        self.request_id = request_id
        self.labels = labels
        self.arrival_ts_ns, self.arrival_time_ns = arrival
        self._last_partial_ts = self.arrival_ts_ns
        self.prompt_tokens = self.cached_tokens = self.kv_bytes = 0

    @property
    def num_emissions(self) -> int:
        return self._n

    @property
    def finished(self) -> bool:
        return self._record is not None

    def token(self) -> None:
        """Record that one token left now. The hot path: a clock read and one store."""
        ts = self._clock()
        try:
            self._buf[self._n] = ts
        except IndexError:  # full (or sealed): zero cost in the common case on 3.11+
            self._store_slow(ts, 1)
            return
        self._n += 1

    def tokens(self, k: int) -> None:
        """Record one emission (a streamed chunk) that carried ``k`` tokens.

        ``k == 0`` (a chunk with no token, such as a role or usage chunk) records nothing:
        it is not an emission. ``k < 0`` is a ``ValueError``.
        """
        if k == 1:
            self.token()
            return
        if k <= 0:
            if k < 0:
                raise ValueError(f"tokens: k must be >= 0, got {k}")
            return
        ts = self._clock()
        n = self._n
        if n < len(self._buf):
            counts = self._counts
            if counts is None:
                counts = self._counts = _ones(len(self._buf))
            self._buf[n] = ts
            counts[n] = k
            self._n = n + 1
        else:
            self._store_slow(ts, k)

    def mark(self, phase: Phase, ts_ns: int | None = None) -> None:
        """Record when ``phase`` happened (now, or at ``ts_ns`` on the recorder's clock).

        Phases must be in time order — QUEUED ≤ PREFILL_START ≤ PREFILL_END ≤
        KV_HANDOFF_START ≤ KV_HANDOFF_END ≤ FINISHED — not before arrival and not in the
        future; a timestamp that breaks this is a ``ValueError`` naming both phases. Marking
        a phase again replaces it.
        """
        phase = Phase(phase)
        if self._record is not None:
            self._recorder._count("late_events")
            return
        now = self._clock()
        ts = now if ts_ns is None else ts_ns
        if ts < self.arrival_ts_ns:
            raise ValueError(
                f"mark({phase.name}): ts_ns {ts} is before the arrival at {self.arrival_ts_ns}"
            )
        if ts > now:
            raise ValueError(f"mark({phase.name}): ts_ns {ts} is in the future (now {now})")
        phases = self._phases
        for other in range(NUM_PHASES):
            other_ts = phases[other]
            if other_ts == _ABSENT or other == phase:
                continue
            if (other < phase and other_ts > ts) or (other > phase and other_ts < ts):
                raise ValueError(
                    f"mark({phase.name}): ts_ns {ts} is out of order with "
                    f"{Phase(other).name} at {other_ts}; phases must be in time order "
                    f"({' <= '.join(p.name for p in Phase)})"
                )
        phases[phase] = ts

    def set_counts(
        self,
        *,
        prompt_tokens: int | None = None,
        cached_tokens: int | None = None,
        kv_bytes: int | None = None,
    ) -> None:
        """Set the request's prompt and prefix-cached token counts and its KV-cache bytes."""
        given = {"prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens}
        given["kv_bytes"] = kv_bytes
        for name, value in given.items():
            if value is not None and value < 0:
                raise ValueError(f"set_counts: {name} must be >= 0, got {value}")
        for name, value in given.items():
            if value is not None:
                setattr(self, name, value)

    def finish(self, status: Status = Status.OK, reason: str = "") -> RequestRecord:
        """Seal the trace and hand its final record to the sink; return the record.

        Idempotent: a second call returns the first record and exports nothing. Marks
        ``FINISHED`` now unless it was marked. ``status`` must not be ``IN_FLIGHT``.
        """
        record = self._record
        if record is not None:
            return record
        status = Status(status)
        if status == Status.IN_FLIGHT:
            raise ValueError("finish: status must be a final status, got IN_FLIGHT")
        recorder = self._recorder
        if self._phases[Phase.FINISHED] == _ABSENT:
            self._phases[Phase.FINISHED] = self._clock()
        with recorder._lock:
            if self._record is not None:  # another thread finished it meanwhile
                return self._record
            record = self._record = self._build(status, reason, final=True)
        buf = self._buf
        self._buf = _SEALED
        self._counts = None
        recorder._finished(self, buf)
        recorder._export(record)
        return record

    def snapshot(self) -> RequestRecord:
        """A partial record (``final=False``, ``IN_FLIGHT``) of the state so far; after
        ``finish`` the final record.
        """
        if self._record is not None:
            return self._record
        return self._build(Status.IN_FLIGHT, "", final=False)

    def _store_slow(self, ts: int, k: int) -> None:
        """The buffer is full: double it (counted), or drop a token after finish (counted)."""
        if self._record is not None:
            self._recorder._count("late_events")
            return
        # New buffers, never resized in place: a snapshot on another thread may hold a view
        # of the old ones. They are published before the count, which _build reads first.
        n = self._n
        old = self._buf
        buf = _zeros(2 * len(old))
        buf[: len(old)] = old
        counts = self._counts
        if counts is not None:
            counts = array("i", counts)
            counts.extend(_ones(len(old)))
        elif k != 1:
            counts = _ones(len(buf))
        buf[n] = ts
        if counts is not None:
            counts[n] = k
        self._buf = buf
        self._counts = counts
        self._n = n + 1
        self._recorder._count("buffer_growths")

    def _build(self, status: Status, reason: str, *, final: bool) -> RequestRecord:
        # Read the count before the buffer: a concurrent grow only ever replaces the buffer
        # with a longer copy, so the first n entries are valid in whichever we read.
        n = self._n
        buf = self._buf
        counts = self._counts
        arrival = self.arrival_ts_ns
        offsets_us = (np.frombuffer(buf, dtype=np.int64, count=n) - arrival) // 1000
        tokens = None
        if counts is not None:
            tokens = np.frombuffer(counts, dtype=np.int32, count=n).copy()
        phases = np.array(self._phases, dtype=np.int64)
        present = phases != _ABSENT
        phases[present] = (phases[present] - arrival) // 1000
        return RequestRecord(
            request_id=self.request_id,
            vantage=self._recorder.vantage,
            arrival_time_ns=self.arrival_time_ns,
            labels=self.labels,
            emission_offsets_us=offsets_us,
            emission_tokens=tokens,
            phase_offsets_us=phases,
            kv_bytes=self.kv_bytes,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            status=status,
            reason=reason,
            final=final,
        )


def _zeros(n: int) -> memoryview:
    return memoryview(bytearray(8 * n)).cast("q")


def _ones(n: int) -> array[int]:
    return array("i", [1]) * n
