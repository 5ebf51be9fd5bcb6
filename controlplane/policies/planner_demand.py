"""What arrives: the planner's demand, from the records the control plane ingests or, in the
simulator, from the requests passing the gateway's seam. Pure (the clock is passed in),
columnar (a few numpy operations per tick), thread-safe (the ingest listener and the
planner tick run on different threads).

Each request counts once: its arrival time, prompt tokens and output tokens.

* :meth:`DemandWindow.observe` takes a batch of final records. The gateway's records are
  the demand; when no gateway record arrived within the window (a fleet without our
  gateway), engine records that decoded at least two tokens stand in (a PD request has one
  engine record per instance; the prefill one carries a single token). A batch counts from
  the time it was received.
* :meth:`DemandWindow.add` takes one request as the gateway sees it arrive (the
  simulator's adapters: its arrival time, prompt tokens, ``max_tokens`` as the output); it
  counts from its arrival. Requests are added in arrival order.

:meth:`DemandWindow.demand` turns the last ``window_s`` seconds (the rates divide by the
window, or before it is full by the time since the first request or the span of the
arrivals, whichever is longer) into requests/s, prompt and output tokens/s, and the squared
coefficients of variation of inter-arrival times and prompt lengths, which the planner's
queueing model needs; :meth:`DemandWindow.means` into the count and the mean lengths.

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
    received_s: F64  # per request: when it entered the window (in time order)
    gateway: bool
    arrival_s: F64
    prompt_tokens: F64
    output_tokens: F64

    def since(self, cutoff_s: float) -> _Chunk | None:
        """The requests received at or after ``cutoff_s`` (``None``: none left)."""
        if self.received_s[0] >= cutoff_s:
            return self
        keep = self.received_s >= cutoff_s
        if not keep.any():
            return None
        return _Chunk(
            self.received_s[keep],
            self.gateway,
            self.arrival_s[keep],
            self.prompt_tokens[keep],
            self.output_tokens[keep],
        )


def _scv(values: F64) -> float:
    """Squared coefficient of variation (1.0 when it cannot be told)."""
    mean = float(values.mean()) if values.size else 0.0
    return float(values.var() / (mean * mean)) if mean > 0 else 1.0


class DemandWindow:
    """The last ``window_s`` seconds of requests (see the module docstring)."""

    def __init__(self, window_s: float = 60.0) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._chunks: deque[_Chunk] = deque()
        self._pending: list[tuple[float, int, int]] = []  # add()ed, not yet a chunk
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
                n = int(mask.sum())
                if n:
                    self._chunks.append(
                        _Chunk(
                            np.full(n, now_s),
                            is_gateway,
                            batch.arrival_time_ns[mask].astype(np.float64) / 1e9,
                            batch.prompt_tokens[mask].astype(np.float64),
                            output[mask].astype(np.float64),
                        )
                    )
                    self.num_records += n
            if self._first_s is None:
                self._first_s = now_s

    def add(self, arrival_s: float, prompt_tokens: int, output_tokens: int) -> None:
        """Count one request arriving at the gateway at ``arrival_s``."""
        with self._lock:
            self._pending.append((arrival_s, prompt_tokens, output_tokens))
            self.num_records += 1
            if self._first_s is None:
                self._first_s = arrival_s

    def _window(self, now_s: float) -> tuple[list[_Chunk], float | None]:
        """The chunks of the window at ``now_s`` (gateway ones where there are any)."""
        cutoff = now_s - self.window_s
        with self._lock:
            if self._pending:
                rows = np.array(self._pending, dtype=np.float64)
                self._pending.clear()
                arrival = rows[:, 0]
                self._chunks.append(_Chunk(arrival, True, arrival, rows[:, 1], rows[:, 2]))
            while self._chunks:
                head = self._chunks[0].since(cutoff)
                if head is not None:
                    self._chunks[0] = head
                    break
                self._chunks.popleft()
            chunks = list(self._chunks)
            first = self._first_s
        use_gateway = any(c.gateway for c in chunks)
        return [c for c in chunks if c.gateway == use_gateway], first

    def demand(self, now_s: float) -> Demand:
        """Requests/s, prompt and output tokens/s over the window (zeros when empty)."""
        chosen, first = self._window(now_s)
        if not chosen or first is None:
            return Demand(0.0, 0.0, 0.0)
        arrivals = np.sort(np.concatenate([c.arrival_s for c in chosen]))
        prompts = np.concatenate([c.prompt_tokens for c in chosen])
        outputs = np.concatenate([c.output_tokens for c in chosen])
        # The time the records cover: the window once it is full; before that, since the
        # first request came, or the span of their arrivals (a backfill after a restart)
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

    def means(self, now_s: float) -> tuple[int, float, float]:
        """The requests in the window, their mean prompt and mean output tokens."""
        chosen, _ = self._window(now_s)
        n = sum(c.arrival_s.size for c in chosen)
        if n == 0:
            return 0, 0.0, 0.0
        prompt = sum(float(c.prompt_tokens.sum()) for c in chosen)
        output = sum(float(c.output_tokens.sum()) for c in chosen)
        return n, prompt / n, output / n
