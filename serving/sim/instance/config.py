"""How one simulated engine instance batches: the strategy and its limits.

The four strategies of the seed article (docs/simulator.md):

* ``static`` — wait until ``batch_size`` requests are queued, prefill them in one step and
  decode them together to the end: a finished sequence keeps its seat (padding) until the
  whole batch is done, and nothing joins a running batch.
* ``dynamic`` — as static, but a batch also starts when its oldest request has waited
  ``batch_window_s`` (the time window), with whatever has arrived by then.
* ``continuous`` — iteration-level scheduling (vLLM V0 without chunking): at every
  iteration boundary finished sequences leave and queued ones join; a prefill iteration
  (whole prompts, up to ``max_num_batched_tokens``) takes priority over decoding.
* ``chunked`` — continuous batching with chunked prefill (vLLM V1): every iteration has a
  budget of ``max_num_batched_tokens``; running decodes take one token each first, then
  prefill chunks of queued or partly prefilled prompts fill the rest.

Every strategy honours ``max_num_seqs`` running sequences and a KV cache of
``kv_capacity_tokens`` in blocks of ``block_size`` tokens, preempting the newest running
sequence (recompute) when a running one needs a block and none is free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["InstanceConfig", "Strategy"]


class Strategy(StrEnum):
    """The batching strategy of an instance (see the module docstring)."""

    STATIC = "static"
    DYNAMIC = "dynamic"
    CONTINUOUS = "continuous"
    CHUNKED = "chunked"


@dataclass(frozen=True, slots=True)
class InstanceConfig:
    """An instance's scheduler settings.

    ``kv_capacity_tokens`` ``None`` sizes the KV cache from the model and its tensor
    parallelism (:func:`serving.sim.kv.kv_capacity_tokens` at ``memory_utilization``).
    ``prefix_block_tokens`` is the size of one prefix-cache block id of the trace (Mooncake's
    ``hash_ids`` cover 512 tokens each). ``jitter_ratio`` scales every step time by
    ``1 + jitter_ratio × u`` with ``u`` uniform in ``[-1, 1)`` from the instance's seeded
    generator. ``max_segment_steps`` caps how many decode iterations one event may cover
    (``None``: until the batch changes; ``1``: one event per iteration, the reference the
    fast path is tested against).

    Example::

        InstanceConfig(strategy=Strategy.DYNAMIC, batch_size=8, batch_window_s=0.05)
    """

    strategy: Strategy = Strategy.CHUNKED
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    batch_size: int = 8
    batch_window_s: float = 0.05
    block_size: int = 16
    kv_capacity_tokens: int | None = None
    memory_utilization: float = 0.9
    prefix_caching: bool = True
    prefix_block_tokens: int = 512
    jitter_ratio: float = 0.0
    max_segment_steps: int | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "strategy", Strategy(self.strategy))
        except ValueError:
            raise ValueError(
                f"strategy must be one of {[s.value for s in Strategy]}, got {self.strategy!r}"
            ) from None
        for name in ("max_num_seqs", "max_num_batched_tokens", "batch_size", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not (math.isfinite(self.batch_window_s) and self.batch_window_s >= 0):
            raise ValueError(
                f"batch_window_s must be a finite number >= 0, got {self.batch_window_s!r}"
            )
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < self.block_size:
            raise ValueError(
                f"kv_capacity_tokens must be >= block_size ({self.block_size}), "
                f"got {self.kv_capacity_tokens}"
            )
        if not 0 < self.memory_utilization <= 1:
            raise ValueError(
                f"memory_utilization must be in (0, 1], got {self.memory_utilization!r}"
            )
        if self.prefix_block_tokens < 1 or self.prefix_block_tokens % self.block_size:
            raise ValueError(
                f"prefix_block_tokens must be a positive multiple of block_size "
                f"({self.block_size}), got {self.prefix_block_tokens}"
            )
        if not 0 <= self.jitter_ratio < 1:
            raise ValueError(f"jitter_ratio must be in [0, 1), got {self.jitter_ratio!r}")
        if self.max_segment_steps is not None and self.max_segment_steps < 1:
            raise ValueError(
                f"max_segment_steps must be None or >= 1, got {self.max_segment_steps!r}"
            )
