"""Baselines the control loops are measured against, in the simulator's policy seam.

* :class:`ThresholdShedder` — Dynamo's busy-threshold load shedding: a monitor marks an
  instance busy when its active prefill tokens or its KV cache use pass a threshold, and
  the frontend rejects a request (503 there, ``REJECTED`` here) when every instance of the
  pool it would be routed to is busy. The routing sends a request to the least-loaded
  instance, so "every instance busy" is "the chosen instance is busy". Like Dynamo's
  worker monitor it decides from the last snapshot it took (every ``interval_s``), not
  from live state; it never moves an instance.
* :func:`static_splits` / :func:`best_static_split` — the best fixed P:D split of a GPU
  count, found by a sweep (the caller says how one split is scored, so the sweep is pure).

The decision itself is a pure function (:func:`busy_decision`) of the instances' views and
the thresholds; the class only remembers the last snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from exporters.fleet import PoolRole
from serving.gateway.admission import ADMIT, Decision, RequestInfo
from serving.sim.cluster.policy import ClusterSnapshot, InstanceView

__all__ = [
    "BusyThresholds",
    "SplitScore",
    "ThresholdShedder",
    "best_static_split",
    "busy_decision",
    "static_splits",
]


@dataclass(frozen=True, slots=True)
class BusyThresholds:
    """When an instance counts as busy (Dynamo's ``--active-prefill-tokens-threshold`` and
    ``--active-decode-blocks-threshold``; defaults are the values its docs show). A
    threshold of ``inf`` (tokens) or ``> 1`` (KV ratio) disables that check."""

    prefill_tokens: float = 10_000.0
    decode_kv_ratio: float = 0.85

    def __post_init__(self) -> None:
        if not (self.prefill_tokens > 0):
            raise ValueError(f"prefill_tokens: must be > 0, got {self.prefill_tokens!r}")
        if not (self.decode_kv_ratio > 0):
            raise ValueError(f"decode_kv_ratio: must be > 0, got {self.decode_kv_ratio!r}")


def _prefill_busy(view: InstanceView, limits: BusyThresholds) -> bool:
    return view.prefill_tokens > limits.prefill_tokens


def _decode_busy(view: InstanceView, limits: BusyThresholds) -> bool:
    return view.kv_used_ratio > limits.decode_kv_ratio


def busy_decision(instances: Sequence[InstanceView], limits: BusyThresholds) -> Decision:
    """Reject when every prefill-capable instance is prefill-busy or every decode-capable
    instance is KV-busy (a ``both`` instance counts in each pool); else admit. With no
    instance observed yet, admit (fail open, as Dynamo does before its first update)."""
    prefill = [v for v in instances if v.role is not PoolRole.DECODE]
    decode = [v for v in instances if v.role is not PoolRole.PREFILL]
    if prefill and all(_prefill_busy(v, limits) for v in prefill):
        least = min(v.prefill_tokens for v in prefill)
        return Decision(
            False,
            f"all prefill instances busy: least active prefill tokens {least} > "
            f"{limits.prefill_tokens:g}",
            retry_after_s=1.0,
        )
    if decode and all(_decode_busy(v, limits) for v in decode):
        least_kv = min(v.kv_used_ratio for v in decode)
        return Decision(
            False,
            f"all decode instances busy: least KV use {least_kv:.2f} > {limits.decode_kv_ratio:g}",
            retry_after_s=1.0,
        )
    return ADMIT


class ThresholdShedder:
    """Dynamo-style busy-threshold shedding as a :class:`~serving.sim.cluster.SimPolicy`.

    ``interval_s`` is how often its monitor refreshes the busy state (the simulator's plan
    tick); between refreshes every request is decided from the last one.
    """

    def __init__(self, thresholds: BusyThresholds | None = None, interval_s: float = 0.5) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s: must be a finite number > 0, got {interval_s!r}")
        self.thresholds = thresholds or BusyThresholds()
        self.interval_s = interval_s
        self._decision = ADMIT
        self.num_rejected = 0

    def admit(self, info: RequestInfo) -> Decision:
        del info
        decision = self._decision
        if not decision.admit:
            self.num_rejected += 1
        return decision

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        self._decision = busy_decision(snapshot.instances, self.thresholds)
        return {}


def static_splits(num_instances: int, *, stride: int = 1) -> list[tuple[int, int]]:
    """Every ``(prefill, decode)`` split of ``num_instances`` with at least one of each,
    prefill counts ``1, 1 + stride, ...`` (and always the last one, ``n - 1``)."""
    if num_instances < 2:
        raise ValueError(f"num_instances: a PD split needs >= 2, got {num_instances}")
    if stride < 1:
        raise ValueError(f"stride: must be >= 1, got {stride}")
    counts = list(range(1, num_instances, stride))
    if counts[-1] != num_instances - 1:
        counts.append(num_instances - 1)
    return [(p, num_instances - p) for p in counts]


@dataclass(frozen=True, slots=True)
class SplitScore:
    """One split's score in a sweep, and the best split."""

    best: tuple[int, int]
    best_score: float
    scores: Mapping[tuple[int, int], float]


def best_static_split(
    splits: Iterable[tuple[int, int]], score: Callable[[tuple[int, int]], float]
) -> SplitScore:
    """The split with the highest ``score`` (the first listed among equals)."""
    scores: dict[tuple[int, int], float] = {}
    best: tuple[int, int] | None = None
    for split in splits:
        value = float(score(split))
        scores[split] = value
        if best is None or value > scores[best]:
            best = split
    if best is None:
        raise ValueError("splits: the sweep needs at least one split")
    return SplitScore(best=best, best_score=scores[best], scores=scores)
