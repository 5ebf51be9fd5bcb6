"""Iteration times of one instance, composed from the fitted H100 curves.

* A **decode** iteration of ``B`` sequences whose KV caches hold ``C`` tokens takes the
  decode curve at ``(B, C)``.
* An iteration with **prefill** work pushes its prefill chunks and its decodes (one token
  each) through the same GEMMs, so it takes the prefill curve at ``x = chunk tokens + B``,
  with causal attention ``c·Σ(l² + 2·l·p)`` for a chunk of ``l`` tokens after ``p`` tokens
  already in the KV cache (cached prefix or earlier chunks: chunks of one prompt add up to
  its ``c·L²``), plus the decodes' KV reads ``k·C``.
* A **run** of ``n`` decode iterations of a fixed batch (nothing joins or leaves) is one
  numpy expression: the context grows by ``growth`` tokens per iteration, so iteration
  ``i`` takes ``decode(B, C) + k·growth·i``, and the end times are a cumulative sum.

Jitter (``jitter_ratio > 0``) scales each iteration by ``1 + jitter_ratio·u`` with ``u``
uniform in ``[-1, 1)``, drawn in blocks from the instance's generator so that results
depend on the seed and the inputs only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from serving.sim.latency_model import LatencyModel

__all__ = ["Seed", "StepTimer"]

F64 = npt.NDArray[np.float64]
Seed = int | Sequence[int] | None
_NOISE_BLOCK = 4096
_accumulate = np.add.accumulate
#: ``arange(n) * (k·growth)`` per ``(k, growth)``, shared by the instances of a profile:
#: a run's context ramp is then one slice (growth is the batch size, so few values occur).
_GROWTH_RAMPS: dict[tuple[float, int], F64] = {}
_RAMP_LENGTH = 1024
_RAMP_CACHE_LIMIT = 16384  # longer runs (rare: outputs of 16k tokens) are computed, not kept


def _growth_ramp(per_token_s: float, growth: int, num_steps: int) -> F64:
    if num_steps > _RAMP_CACHE_LIMIT:
        return np.arange(num_steps, dtype=np.float64) * (per_token_s * growth)
    key = (per_token_s, growth)
    ramp = _GROWTH_RAMPS.get(key)
    if ramp is None or ramp.shape[0] < num_steps:
        length = _RAMP_LENGTH if ramp is None else ramp.shape[0]
        while length < num_steps:
            length *= 2
        ramp = _GROWTH_RAMPS[key] = np.arange(length, dtype=np.float64) * (per_token_s * growth)
    return ramp


class StepTimer:
    """Iteration times for one instance (see the module docstring)."""

    __slots__ = (
        "_decode",
        "_decode_coefficients",
        "_kd",
        "_noise",
        "_noise_at",
        "_prefill",
        "_ramps",
        "_rng",
        "jitter",
    )

    def __init__(self, latency: LatencyModel, jitter_ratio: float = 0.0, seed: Seed = None) -> None:
        self._prefill = latency.profile.prefill
        self._decode = decode = latency.profile.decode
        self._kd = decode.per_attention_unit_s
        self._decode_coefficients = (
            decode.base_s,
            decode.per_unit_s,
            float(decode.knee),
            decode.per_unit_above_knee_s,
        )
        self.jitter = jitter_ratio
        self._rng = np.random.default_rng(seed)
        self._noise = np.zeros(0, dtype=np.float64)
        self._noise_at = 0
        self._ramps: dict[int, F64] = {}  # this instance's view of _GROWTH_RAMPS

    def _refill(self, n: int) -> None:
        if self._noise_at + n > self._noise.shape[0]:
            size = max(_NOISE_BLOCK, n)
            self._noise = 1.0 + self.jitter * self._rng.uniform(-1.0, 1.0, size)
            self._noise_at = 0

    def iteration_s(
        self, chunk_tokens: int, attention_units: int, num_decodes: int, decode_context: int
    ) -> float:
        """One iteration: prefill chunks (``chunk_tokens`` in all, ``attention_units`` =
        ``Σ(l² + 2·l·p)``) beside ``num_decodes`` decodes reading ``decode_context`` tokens."""
        if chunk_tokens:
            seconds = (
                self._prefill.at(float(chunk_tokens + num_decodes), float(attention_units))
                + self._kd * decode_context
            )
        else:
            seconds = self._decode.at(float(num_decodes), float(decode_context))
        if self.jitter:
            self._refill(1)
            seconds *= self._noise.item(self._noise_at)
            self._noise_at += 1
        return seconds

    def decode_run_ends(
        self, start_s: float, batch: int, context: int, growth: int, num_steps: int
    ) -> F64:
        """End times of ``num_steps`` decode iterations of ``batch`` sequences starting at
        ``start_s`` with ``context`` KV tokens, growing by ``growth`` per iteration.

        Called once per run (millions of times an hour of a large fleet) on short arrays,
        so it spends as few numpy calls as it can: the context ramp comes precomputed
        per batch size, and ``add.accumulate`` sums into a new array rather than
        ``cumsum(out=...)`` in place (same numbers, half the call overhead)."""
        base, per_seq, knee, above = self._decode_coefficients  # StepCurve.at, inlined
        kd = self._kd
        first = base + per_seq * batch + kd * context
        if batch > knee:
            first += above * (batch - knee)
        ramp = self._ramps.get(growth)
        if ramp is None or ramp.shape[0] < num_steps:
            ramp = _growth_ramp(kd, growth, num_steps)
            if num_steps <= _RAMP_CACHE_LIMIT:
                self._ramps[growth] = ramp
        steps = ramp[:num_steps] + first
        if self.jitter:
            at = self._noise_at
            end = at + num_steps
            if end > self._noise.shape[0]:
                self._refill(num_steps)
                at, end = 0, num_steps
            steps *= self._noise[at:end]
            self._noise_at = end
        ends: F64 = _accumulate(steps)
        ends += start_s
        return ends
