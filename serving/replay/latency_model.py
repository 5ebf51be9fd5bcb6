"""The closed-form latency model of ``goodput demo --engine model``'s replay (no workers, no
gateway): a 1P1D pair serving Llama-3.1-8B on H100s (``docs/demo.md``). The timing-model
engine (``serving.sim``, its own ``LatencyModel``) is the simulated fleet's.

* Prefill: one FIFO server, ``prefill_base_s + input_tokens / prefill_tokens_per_s`` per
  request after those before it, so TTFT grows with the queue (Lindley's recursion).
* KV transfer: ``input_tokens × kv_bytes_per_token`` over one link; the first token is
  emitted when the KV cache lands on the decode instance.
* Decode: continuous batching; back-to-back steps of ``decode_base_s + decode_per_seq_s ×
  batch`` (ITL grows with the batch), one token per running request per step; a ready
  request joins at a step boundary when one of ``max_num_seqs`` slots is free.
* Times are scaled by ``1 + jitter_ratio × u``, ``u`` seeded uniform in ``[-1, 1)``: results
  depend on the inputs and the seed only (beyond float rounding, not on how calls split).

Example::

    model = ReplayLatencyModel(ModelParams(), seed=0)
    model.submit(np.array([0.0, 0.01]), np.array([1000, 3000]), np.array([50, 80]))
    done = model.advance(10.0)  # requests finished by t = 10 s, in finish order
    ttft_s = done[0].emission_s[0] - done[0].arrival_s
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

__all__ = ["ModelParams", "ReplayLatencyModel", "RequestTimings"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
_JITTER_BLOCK = 4096


@dataclass(frozen=True, slots=True)
class ModelParams:
    """The model's fixed parameters (defaults: Llama-3.1-8B in BF16, see ``docs/demo.md``)."""

    prefill_base_s: float = 0.005
    prefill_tokens_per_s: float = 50_000.0
    kv_bytes_per_token: int = 131_072  # 32 layers × 8 KV heads × 128 dims × (K, V) × 2 B
    kv_link_bytes_per_s: float = 50e9  # one 400 Gb/s RDMA NIC
    decode_base_s: float = 0.008
    decode_per_seq_s: float = 0.0001
    max_num_seqs: int = 256
    jitter_ratio: float = 0.05

    def __post_init__(self) -> None:
        for f in fields(self):
            value, zero_ok = getattr(self, f.name), f.name in ("prefill_base_s", "jitter_ratio")
            top = 1 if f.name == "jitter_ratio" else math.inf
            if not ((value >= 0 if zero_ok else value > 0) and value < top):
                interval = f"{'[' if zero_ok else '('}0, {top})"
                raise ValueError(f"{f.name} must be in {interval}, got {value!r}")


@dataclass(frozen=True, slots=True)
class RequestTimings:
    """One finished request, in model seconds. ``emission_s[i]`` is when token *i* was
    emitted (the first when the KV cache landed, the rest at decode step ends)."""

    index: int  # submission order, from 0
    arrival_s: float
    prefill_start_s: float
    prefill_end_s: float
    kv_end_s: float
    emission_s: F64

    @property
    def finish_s(self) -> float:
        return float(self.emission_s[-1])


class ReplayLatencyModel:
    """The 1P1D model of the module docstring, advanced in model time (see the example)."""

    def __init__(self, params: ModelParams | None = None, seed: int = 0) -> None:
        self.params = params or ModelParams()
        # Two streams, so prefill draws (per submit) and step draws never interleave.
        self._prefill_rng, self._step_rng = map(
            np.random.default_rng, np.random.SeedSequence(seed).spawn(2)
        )
        self._step_jitter: list[float] = []
        self._prefill_free_s = 0.0  # when the prefill GPU is next idle
        self._last_arrival_s = 0.0
        self._advanced_to_s = 0.0
        self._num_submitted = 0
        # index -> (arrival, prefill start, prefill end, kv end, decode tokens), until done
        self._requests: dict[int, tuple[float, float, float, float, int]] = {}
        self._ready: list[tuple[float, int]] = []  # (kv_end_s, index): waiting for a slot
        self._no_decode: list[tuple[float, int]] = []  # one-token requests, done at kv_end
        self._join_step: dict[int, int] = {}  # running index -> first step it decodes in
        self._finishing: defaultdict[int, list[int]] = defaultdict(list)  # last step -> idx
        self._step_ends: list[float] = []  # end time of step (_step_base + k)
        self._step_base = 0
        self._num_steps = 0
        self._clock_s = 0.0  # end of the last completed step
        self._step_end_s: float | None = None  # the step in progress, if any

    def submit(self, arrival_s: F64, input_tokens: I64, output_tokens: I64) -> None:
        """Queue requests (arrivals non-decreasing, not before earlier ones). A request with
        ``output_tokens`` 0 is treated as 1: a completion carries at least one token."""
        n = arrival_s.shape[0]
        if input_tokens.shape != (n,) or output_tokens.shape != (n,):
            raise ValueError(
                f"input_tokens and output_tokens must have {n} values like arrival_s, got "
                f"{input_tokens.shape} and {output_tokens.shape}"
            )
        if n == 0:
            return
        floor = max(self._last_arrival_s, self._advanced_to_s)
        if not np.isfinite(arrival_s).all() or (np.diff(arrival_s, prepend=floor) < 0).any():
            raise ValueError(
                f"arrival_s must be finite, non-decreasing and >= {floor!r} (the last arrival "
                f"or advance), got {arrival_s[:8].tolist()!r}"
            )
        if int(input_tokens.min()) < 0 or int(output_tokens.min()) < 0:
            raise ValueError("input_tokens and output_tokens must be >= 0")
        p = self.params
        jitter = 1.0 + p.jitter_ratio * (2.0 * self._prefill_rng.random(n) - 1.0)
        service = (p.prefill_base_s + input_tokens / p.prefill_tokens_per_s) * jitter
        # Lindley's recursion end_i = max(arrival_i, end_{i-1}) + service_i, unrolled:
        # end_i = C_i + max(free, max_{j<=i}(arrival_j - C_{j-1})) with C the cumsum.
        csum = np.cumsum(service)
        lead = np.maximum.accumulate(arrival_s - (csum - service))
        end = csum + np.maximum(lead, self._prefill_free_s)
        start = end - service
        kv_end = end + input_tokens * (p.kv_bytes_per_token / p.kv_link_bytes_per_s)
        self._prefill_free_s = float(end[-1])
        self._last_arrival_s = float(arrival_s[-1])
        base = self._num_submitted
        self._num_submitted += n
        rows = zip(arrival_s.tolist(), start.tolist(), end.tolist(), kv_end.tolist(), strict=True)
        for k, (row, n_out) in enumerate(zip(rows, output_tokens.tolist(), strict=True)):
            index = base + k
            self._requests[index] = (*row, max(1, n_out) - 1)
            heapq.heappush(self._no_decode if n_out <= 1 else self._ready, (row[3], index))

    def advance(self, until_s: float) -> list[RequestTimings]:
        """Run the decode GPU up to ``until_s`` (``math.inf``: until idle); the requests
        finished by then, in finish order. Submit every arrival up to ``until_s`` first."""
        self._advanced_to_s = max(self._advanced_to_s, until_s)
        done: list[RequestTimings] = []
        while self._no_decode and self._no_decode[0][0] <= until_s:
            done.append(self._timings(heapq.heappop(self._no_decode)[1], np.zeros(0)))
        while self._step_end_s is None or self._step_end_s <= until_s:
            if self._step_end_s is not None:
                done.extend(self._complete_step())
            if not self._start_step(until_s):
                break
        done.sort(key=lambda t: t.finish_s)
        return done

    def _start_step(self, until_s: float) -> bool:
        if not (self._join_step or self._ready):
            return False
        start = self._clock_s if self._join_step else max(self._clock_s, self._ready[0][0])
        if start > until_s:
            return False
        slots = self.params.max_num_seqs - len(self._join_step)
        while self._ready and self._ready[0][0] <= start and slots > 0:
            slots -= 1
            _, index = heapq.heappop(self._ready)
            self._join_step[index] = self._num_steps
            self._finishing[self._num_steps + self._requests[index][4] - 1].append(index)
        p = self.params
        if not self._step_jitter:  # drawn in blocks: one generator call per 4096 steps
            draws = 2.0 * self._step_rng.random(_JITTER_BLOCK) - 1.0
            self._step_jitter = (1.0 + p.jitter_ratio * draws).tolist()[::-1]
        step_s = p.decode_base_s + p.decode_per_seq_s * len(self._join_step)
        self._clock_s = start
        self._step_end_s = start + step_s * self._step_jitter.pop()
        return True

    def _complete_step(self) -> list[RequestTimings]:
        assert self._step_end_s is not None
        self._step_ends.append(self._step_end_s)
        self._clock_s, self._step_end_s = self._step_end_s, None
        step = self._num_steps
        self._num_steps += 1
        done = []
        for index in self._finishing.pop(step, ()):
            first = self._join_step.pop(index) - self._step_base
            ends = np.array(self._step_ends[first : step + 1 - self._step_base])
            done.append(self._timings(index, ends))
        if len(self._step_ends) > 8192:  # forget the steps no running request needs
            keep_from = min(self._join_step.values(), default=self._num_steps)
            del self._step_ends[: keep_from - self._step_base]
            self._step_base = keep_from
        return done

    def _timings(self, index: int, decode_ends: F64) -> RequestTimings:
        arrival, start, end, kv_end, _ = self._requests.pop(index)
        emission_s = np.concatenate(([kv_end], decode_ends))
        return RequestTimings(index, arrival, start, end, kv_end, emission_s)
