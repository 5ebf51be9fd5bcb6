"""A Dynamo-style SLA planner: the baseline our planner is compared with. Pure.

NVIDIA Dynamo's SLA planner (``docs/architecture/sla_planner.md`` in ai-dynamo/dynamo,
"Scaling Algorithm"; defaults in ``components/src/dynamo/planner/defaults.py``: a 180 s
``adjustment_interval``, ``min_endpoint`` 1, one GPU per engine) runs once per interval:

1. collect the interval's request count, mean input length (ISL), mean output length (OSL)
   and mean TTFT / ITL;
2. correction factors ``prefill_correction = actual_ttft / expected_ttft`` and
   ``decode_correction = actual_itl / expected_itl`` (expected: from the profile);
3. predict the next interval's load (here the constant predictor: the last interval again);
4. ``prefill_replicas = ceil(requests·ISL/interval · min(1, prefill_correction) /
   prefill_throughput_per_gpu(ISL) / gpus_per_engine)`` and
   ``decode_replicas = ceil(requests·OSL/interval / decode_throughput_per_gpu(ITL /
   decode_correction, ISL + OSL/2) / gpus_per_engine)``, where the decode throughput per
   GPU is the best one whose ITL meets the (corrected) target at that context length;
5. scale both pools to those counts, at once (no hysteresis, no dwell).

What differs here, and why: Dynamo scales replicas up and down inside a GPU budget; our
fleet is fixed and the question is its split, so the two counts become the ratio of a split
of the ``N`` instances: ``num_prefill = round(N · p/(p + d))``, clamped so each pool keeps
``min_endpoint``. The profile ("pre-deployment profiling" in Dynamo) is any
:class:`PerformanceProfile`: :class:`ServiceModelProfile` derives it from the same
:class:`~controlplane.policies.planner.ServiceModel` our planner uses, so both see the same
capacities. Operators' pins and drains are honoured as for our planner; which instances move
is chosen the same way (least loaded), so only the decision rule differs.

Example::

    decision = dynamo_split(
        DynamoObservation(num_requests=1800, duration_s=180, isl=2000, osl=200),
        ServiceModelProfile(model), DynamoConfig(ttft_s=0.5, itl_s=0.05), num_instances=8)
    decision.num_prefill, decision.num_decode
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from controlplane.policies.planner import InstanceLoad, ServiceModel
from exporters.fleet import PoolRole

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DynamoConfig",
    "DynamoDecision",
    "DynamoObservation",
    "DynamoPlanner",
    "PerformanceProfile",
    "ServiceModelProfile",
    "decode_replicas",
    "dynamo_split",
    "prefill_replicas",
]

DEFAULT_INTERVAL_S = 180.0  # Dynamo's adjustment_interval default


@dataclass(frozen=True, slots=True)
class DynamoConfig:
    """The SLA targets and Dynamo's knobs (``interval_s`` = ``adjustment_interval``)."""

    ttft_s: float
    itl_s: float
    interval_s: float = DEFAULT_INTERVAL_S
    prefill_gpus_per_engine: int = 1
    decode_gpus_per_engine: int = 1
    min_endpoint: int = 1

    def __post_init__(self) -> None:
        for name in ("ttft_s", "itl_s", "interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("prefill_gpus_per_engine", "decode_gpus_per_engine", "min_endpoint"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class DynamoObservation:
    """One interval's metrics: request count over ``duration_s``, mean ISL and OSL, and the
    mean TTFT / ITL (``None``: not observed, correction 1) with the mean decode batch per
    engine they were observed at."""

    num_requests: float
    duration_s: float
    isl: float
    osl: float
    ttft_s: float | None = None
    itl_s: float | None = None
    decode_batch: float | None = None


class PerformanceProfile(Protocol):
    """What Dynamo's interpolators answer from pre-deployment profiling."""

    def prefill_tokens_per_s_per_gpu(self, isl: float) -> float: ...

    def expected_ttft_s(self, isl: float) -> float: ...

    def decode_tokens_per_s_per_gpu(self, itl_s: float, context_tokens: float) -> float: ...

    def expected_itl_s(self, batch: float, context_tokens: float) -> float: ...


@dataclass(frozen=True, slots=True)
class ServiceModelProfile:
    """A :class:`PerformanceProfile` from a :class:`ServiceModel` (one instance = one
    engine of ``gpus`` GPUs)."""

    model: ServiceModel
    gpus: int = 1

    def prefill_tokens_per_s_per_gpu(self, isl: float) -> float:
        del isl  # the linear model's rate does not depend on the length
        return self.model.prefill_tokens_per_s / self.gpus

    def expected_ttft_s(self, isl: float) -> float:
        return isl / self.model.prefill_tokens_per_s + self.model.kv_handoff_s

    def decode_tokens_per_s_per_gpu(self, itl_s: float, context_tokens: float) -> float:
        m = self.model
        slope = m.itl_per_seq_s + m.itl_per_context_token_s * context_tokens
        if itl_s <= m.itl_base_s:
            return 0.0
        batch = (itl_s - m.itl_base_s) / slope if slope > 0 else 1e9
        batch = max(batch, 1.0)
        return batch / m.itl_s(batch, batch * context_tokens) / self.gpus

    def expected_itl_s(self, batch: float, context_tokens: float) -> float:
        batch = max(batch, 1.0)
        return self.model.itl_s(batch, batch * context_tokens)


def prefill_replicas(
    tokens_per_s: float, correction: float, throughput_per_gpu: float, gpus_per_engine: int
) -> int:
    """``ceil(tokens/s · min(1, correction) / throughput per GPU / GPUs per engine)``."""
    if throughput_per_gpu <= 0:
        return 0 if tokens_per_s <= 0 else 1_000_000
    load = tokens_per_s * min(1.0, correction)
    return math.ceil(load / throughput_per_gpu / gpus_per_engine)


def decode_replicas(tokens_per_s: float, throughput_per_gpu: float, gpus_per_engine: int) -> int:
    """``ceil(output tokens/s / throughput per GPU at the ITL target / GPUs per engine)``."""
    if throughput_per_gpu <= 0:
        return 0 if tokens_per_s <= 0 else 1_000_000
    return math.ceil(tokens_per_s / throughput_per_gpu / gpus_per_engine)


@dataclass(frozen=True, slots=True)
class DynamoDecision:
    """Dynamo's counts (``need_*``), the split of the fleet they become, and the figures
    behind them."""

    num_prefill: int
    num_decode: int
    need_prefill: int
    need_decode: int
    evidence: Mapping[str, Any] = field(default_factory=dict)


def dynamo_split(
    obs: DynamoObservation,
    profile: PerformanceProfile,
    config: DynamoConfig,
    *,
    num_instances: int,
) -> DynamoDecision:
    """Steps 2–4 of the module docstring, then the split of ``num_instances``."""
    if num_instances < 2 * config.min_endpoint:
        raise ValueError(
            f"num_instances must be >= 2 × min_endpoint ({2 * config.min_endpoint}), "
            f"got {num_instances}"
        )
    rate = obs.num_requests / obs.duration_s if obs.duration_s > 0 else 0.0
    prefill_corr = 1.0
    if obs.ttft_s is not None and obs.isl > 0:
        prefill_corr = obs.ttft_s / profile.expected_ttft_s(obs.isl)
    decode_corr = 1.0
    context = obs.isl + obs.osl / 2.0
    if obs.itl_s is not None and obs.decode_batch is not None:
        decode_corr = obs.itl_s / profile.expected_itl_s(obs.decode_batch, context)
    prefill_thpt = profile.prefill_tokens_per_s_per_gpu(obs.isl)
    corrected_itl = config.itl_s / decode_corr if decode_corr > 0 else config.itl_s
    decode_thpt = profile.decode_tokens_per_s_per_gpu(corrected_itl, context)
    need_p = max(
        config.min_endpoint,
        prefill_replicas(
            rate * obs.isl, prefill_corr, prefill_thpt, config.prefill_gpus_per_engine
        ),
    )
    need_d = max(
        config.min_endpoint,
        decode_replicas(rate * obs.osl, decode_thpt, config.decode_gpus_per_engine),
    )
    num_p = round(num_instances * need_p / (need_p + need_d))
    num_p = max(config.min_endpoint, min(num_instances - config.min_endpoint, num_p))
    evidence = {
        "requests_per_s": rate,
        "isl": obs.isl,
        "osl": obs.osl,
        "prefill_correction": prefill_corr,
        "decode_correction": decode_corr,
        "prefill_tokens_per_s_per_gpu": prefill_thpt,
        "decode_tokens_per_s_per_gpu": decode_thpt,
        "corrected_itl_s": corrected_itl,
        "need_prefill": need_p,
        "need_decode": need_d,
    }
    return DynamoDecision(num_p, num_instances - num_p, need_p, need_d, evidence)


class DynamoPlanner:
    """Runs :func:`dynamo_split` every ``config.interval_s`` of the injected clock and
    moves instances to reach the split at once (no hysteresis, no dwell, as Dynamo).
    Pinned and draining instances stay; the least loaded move."""

    def __init__(self, profile: PerformanceProfile, config: DynamoConfig) -> None:
        self.profile = profile
        self.config = config
        self._next_s: float | None = None
        self.last: DynamoDecision | None = None

    def due(self, now_s: float) -> bool:
        return self._next_s is None or now_s >= self._next_s

    def plan(
        self, now_s: float, instances: Sequence[InstanceLoad], obs: DynamoObservation
    ) -> dict[str, PoolRole]:
        """``{instance id: new role}`` when an interval has passed, else ``{}``."""
        if not self.due(now_s):
            return {}
        self._next_s = now_s + self.config.interval_s
        if obs.num_requests <= 0:
            return {}
        fixed = [i for i in instances if i.pinned or i.draining or i.role is PoolRole.BOTH]
        movable = [i for i in instances if not (i.pinned or i.draining or i.role is PoolRole.BOTH)]
        decision = dynamo_split(obs, self.profile, self.config, num_instances=len(instances))
        self.last = decision
        fixed_p = sum(1 for i in fixed if (i.moving_to or i.role) is PoolRole.PREFILL)
        want_p = max(0, min(len(movable), decision.num_prefill - fixed_p))
        prefill = [i for i in movable if i.role is PoolRole.PREFILL]
        decode = [i for i in movable if i.role is PoolRole.DECODE]
        shift = want_p - len(prefill)
        if shift > 0:
            chosen = sorted(decode, key=lambda i: (i.decode_streams, i.decode_context_tokens, i.id))
            return {i.id: PoolRole.PREFILL for i in chosen[:shift]}
        if shift < 0:
            chosen = sorted(prefill, key=lambda i: (i.prefill_queue_tokens, i.id))
            return {i.id: PoolRole.DECODE for i in chosen[:-shift]}
        return {}
