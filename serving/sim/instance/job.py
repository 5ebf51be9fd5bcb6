"""A request as an instance serves it: what it asks for, how far it got, and when.

A :class:`Job` is mutable state owned by one instance at a time. ``mode`` says what the
instance must do with it:

* ``FULL`` — colocated serving: prefill the prompt (the step that finishes it emits the
  first token), then decode until ``output_tokens`` tokens are out;
* ``PREFILL`` — the prefill half of PD disaggregation: prefill the prompt and hand the KV
  cache off (the job completes on this instance at its prefill end, emitting nothing the
  client sees, as the gateway sends the prefill with ``max_tokens=1`` and drops its token);
* ``DECODE`` — the decode half: the prompt's KV cache has landed, so there is nothing to
  prefill; every one of the ``output_tokens`` tokens comes from a decode step here.

Token times are kept as a list of float64 arrays of absolute (virtual) seconds, one array
per iteration or per run of iterations, shared between the jobs of one batch: no per-token
Python object. Phase times are absolute seconds, ``nan`` until they happen.
"""

from __future__ import annotations

import math
from enum import IntEnum

import numpy as np
import numpy.typing as npt

__all__ = ["Job", "JobMode"]

F64 = npt.NDArray[np.float64]
_NAN = math.nan


class JobMode(IntEnum):
    """What an instance does with a job (see the module docstring)."""

    FULL = 0
    PREFILL = 1
    DECODE = 2


class Job:
    """One request on one instance (see the module docstring).

    ``computed`` counts tokens whose KV the instance holds; the prefill is done when it
    reaches ``prefill_target`` (the prompt, or prompt plus generated tokens after a
    preemption, which recomputes them). ``generated`` counts output tokens emitted.
    ``tag`` is an integer free for the caller (the cluster keeps the index of the decode
    instance there).
    """

    __slots__ = (
        "arrival_s",
        "blocks",
        "cached_tokens",
        "computed",
        "emissions",
        "finished_s",
        "generated",
        "hash_ids",
        "hash_refs",
        "index",
        "kv_bytes",
        "kv_end_s",
        "kv_start_s",
        "mode",
        "num_preemptions",
        "output_tokens",
        "prefill_end_s",
        "prefill_start_s",
        "prefill_target",
        "prompt_tokens",
        "queued_s",
        "shared_blocks",
        "tag",
    )

    def __init__(
        self,
        index: int,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        *,
        mode: JobMode = JobMode.FULL,
        hash_ids: tuple[int, ...] | list[int] | None = None,
    ) -> None:
        if prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
        if output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, got {output_tokens}")
        self.index = index
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.hash_ids = hash_ids
        self.mode = mode
        self.prefill_target = prompt_tokens
        self.computed = prompt_tokens if mode is JobMode.DECODE else 0
        self.generated = 0
        self.cached_tokens = 0
        self.blocks = 0  # KV blocks this job owns alone
        self.shared_blocks = 0  # KV blocks it reads from the prefix cache
        self.hash_refs: list[int] = []
        self.emissions: list[F64] = []
        self.queued_s = _NAN
        self.prefill_start_s = _NAN
        self.prefill_end_s = _NAN
        self.kv_start_s = _NAN
        self.kv_end_s = _NAN
        self.finished_s = _NAN
        self.kv_bytes = 0
        self.num_preemptions = 0
        self.tag = -1

    def __repr__(self) -> str:
        return (
            f"Job({self.index}, mode={self.mode.name}, prompt={self.prompt_tokens}, "
            f"output={self.generated}/{self.output_tokens}, computed={self.computed})"
        )

    @property
    def needs_prefill(self) -> bool:
        return self.computed < self.prefill_target

    @property
    def done(self) -> bool:
        """Finished on this instance: all tokens out, or (``PREFILL``) the prompt computed."""
        if self.mode is JobMode.PREFILL:
            return self.computed >= self.prefill_target
        return self.generated >= self.output_tokens

    def emission_times(self) -> F64:
        """Every token's time (absolute seconds), in order."""
        if not self.emissions:
            return np.zeros(0, dtype=np.float64)
        return np.concatenate(self.emissions)

    def hand_off(self, now_s: float) -> None:
        """Turn a completed ``PREFILL`` job into the ``DECODE`` job its KV cache becomes."""
        if self.mode is not JobMode.PREFILL or self.needs_prefill:
            raise ValueError(f"hand_off: job {self.index} is not a completed PREFILL job")
        self.mode = JobMode.DECODE
        self.prefill_target = self.prompt_tokens
        self.computed = self.prompt_tokens
        self.kv_start_s = now_s
