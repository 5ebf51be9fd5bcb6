"""What arrives, from the records the control plane ingests: the planner's demand. Pure
(the clock is passed in), columnar (a few numpy operations per batch), thread-safe (the
ingest listener and the planner tick run on different threads).

Each final record is one request: its arrival time, prompt tokens and output tokens. The
gateway's records are the demand; when no gateway record arrived within the window (a
fleet without our gateway), engine records that decoded at least two tokens stand in (a
PD request has one engine record per instance; the prefill one carries a single token).

:meth:`DemandWindow.demand` turns the last ``window_s`` seconds of records (by the time
they were received; the rates divide by the window, or before it is full by the time since
the first batch or the span of the records' arrivals, whichever is longer) into requests/s,
prompt and output tokens/s, and the squared coefficients of variation of inter-arrival
times and prompt lengths, which the planner's queueing model needs.

Example::

    window = DemandWindow(60.0)
    ingestor.add_listener(lambda batch, source: window.observe(batch, time.time()))
    demand = window.demand(time.time())
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controlplane.policies.planner import Demand
from exporters.records import RecordBatch, Vantage

__all__ = ["DemandWindow"]

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class _Chunk:
    received_s: float
    gateway: bool
    arrival_s: F64
    prompt_tokens: F64
    output_tokens: F64


def _scv(values: F64) -> float:
    mean = float(values.mean()) if values.size else 0.0
    return float(values.var() / (mean * mean)) if mean > 0 else 1.0


class DemandWindow:
    """The last ``window_s`` seconds of requests (see the module docstring)."""

    def __init__(self, window_s: float = 60.0) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._chunks: deque[_Chunk] = deque()
        self._lock = threading.Lock()
        self._first_s: float | None = None
        self.num_records = 0

    def observe(self, batch: RecordBatch, now_s: float) -> None:
        """Keep the final records of ``batch``, received at ``now_s``."""
        final = np.asarray(batch.final, dtype=bool)
        if not final.any():
            return
        output = batch.output_tokens()
        gateway = final & (batch.vantage == Vantage.GATEWAY)
        engine = final & (batch.vantage == Vantage.ENGINE) & (output >= 2)
        with self._lock:
            for mask, is_gateway in ((gateway, True), (engine, False)):
                if mask.any():
                    self._chunks.append(
                        _Chunk(
                            now_s,
                            is_gateway,
                            batch.arrival_time_ns[mask].astype(np.float64) / 1e9,
                            batch.prompt_tokens[mask].astype(np.float64),
                            output[mask].astype(np.float64),
                        )
                    )
                    self.num_records += int(mask.sum())
            if self._first_s is None:
                self._first_s = now_s

    def demand(self, now_s: float) -> Demand:
        """Requests/s, prompt and output tokens/s over the window (zeros when empty)."""
        with self._lock:
            while self._chunks and self._chunks[0].received_s < now_s - self.window_s:
                self._chunks.popleft()
            chunks = list(self._chunks)
            first = self._first_s
        if not chunks or first is None:
            return Demand(0.0, 0.0, 0.0)
        use_gateway = any(c.gateway for c in chunks)
        chosen = [c for c in chunks if c.gateway == use_gateway]
        arrivals = np.sort(np.concatenate([c.arrival_s for c in chosen]))
        prompts = np.concatenate([c.prompt_tokens for c in chosen])
        outputs = np.concatenate([c.output_tokens for c in chosen])
        # The time the records cover: the window once it is full; before that, since the
        # first batch came, or the span of their arrivals (a backfill after a restart)
        # when that is longer.
        arrival_span = float(arrivals[-1] - arrivals[0]) if arrivals.size else 0.0
        span = max(min(self.window_s, max(now_s - first, arrival_span)), 1.0)
        n = arrivals.size
        return Demand(
            requests_per_s=n / span,
            prompt_tokens_per_s=float(prompts.sum()) / span,
            output_tokens_per_s=float(outputs.sum()) / span,
            arrival_scv=_scv(np.diff(arrivals)) if n >= 3 else 1.0,
            service_scv=_scv(prompts) if n >= 3 else 0.0,
        )
