"""The planner's model: capacities, demand and SLO targets, the predicted attainment of
every candidate P:D split, and the TTFT correction from observed attainment. Pure (no I/O,
no clock); the derivation is in ``controlplane.policies.planner``'s docstring and
``docs/planner.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from controlplane.policies.learning import LearnedParams

__all__ = [
    "Demand",
    "SLOTargets",
    "ServiceModel",
    "check_positive",
    "predict_splits",
    "service_model",
    "ttft_correction",
]

F64 = npt.NDArray[np.float64]
_EPS = 1e-12


def check_positive(name: str, value: float, *, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and ok):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """Per-instance capacity: prefill ``prefill_tokens_per_s``; decode step time
    ``itl_base_s + itl_per_seq_s·b + itl_per_context_token_s·C`` (``b`` sequences holding
    ``C`` context tokens); ``kv_handoff_s`` from prefill to decode."""

    prefill_tokens_per_s: float
    itl_base_s: float
    itl_per_seq_s: float
    itl_per_context_token_s: float = 0.0
    kv_handoff_s: float = 0.0

    def __post_init__(self) -> None:
        check_positive("prefill_tokens_per_s", self.prefill_tokens_per_s)
        check_positive("itl_base_s", self.itl_base_s)
        for name in ("itl_per_seq_s", "itl_per_context_token_s", "kv_handoff_s"):
            check_positive(name, getattr(self, name), allow_zero=True)

    def itl_s(self, batch: float, context_tokens: float) -> float:
        return (
            self.itl_base_s
            + self.itl_per_seq_s * batch
            + self.itl_per_context_token_s * context_tokens
        )

    def to_json(self) -> dict[str, float]:
        return {
            "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "itl_base_s": self.itl_base_s,
            "itl_per_seq_s": self.itl_per_seq_s,
            "itl_per_context_token_s": self.itl_per_context_token_s,
            "kv_handoff_s": self.kv_handoff_s,
        }


def service_model(params: LearnedParams) -> ServiceModel:
    """The planner's capacity model from the learned latency model (live, the learner's
    estimate; in the simulator, what the learner converges to on the profiled hardware)."""
    return ServiceModel(
        prefill_tokens_per_s=params.prefill_tokens_per_s,
        itl_base_s=params.itl_base_s,
        itl_per_seq_s=params.itl_per_stream_s,
        itl_per_context_token_s=params.itl_per_context_token_s,
        kv_handoff_s=params.kv_handoff_s,
    )


@dataclass(frozen=True, slots=True)
class SLOTargets:
    """The per-request objectives the split is chosen for."""

    ttft_s: float
    itl_s: float

    def __post_init__(self) -> None:
        check_positive("ttft_s", self.ttft_s)
        check_positive("itl_s", self.itl_s)


@dataclass(frozen=True, slots=True)
class Demand:
    """What arrives (per second, over the recent window). ``arrival_scv`` and
    ``service_scv`` are the squared coefficients of variation of the inter-arrival times and
    of the prompt lengths (1 and 0: Poisson arrivals of equal prompts, the M/D/1 case);
    bursty traces have ``arrival_scv`` far above 1."""

    requests_per_s: float
    prompt_tokens_per_s: float
    output_tokens_per_s: float
    arrival_scv: float = 1.0
    service_scv: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "requests_per_s",
            "prompt_tokens_per_s",
            "output_tokens_per_s",
            "arrival_scv",
            "service_scv",
        ):
            check_positive(name, getattr(self, name), allow_zero=True)


def _normal_cdf(x: F64) -> F64:
    """Φ(x), vectorised (Abramowitz & Stegun 7.1.26 for erf; absolute error < 1.5e-7)."""
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = 1.0 - poly * np.exp(-z * z)
    return np.asarray(0.5 * (1.0 + np.sign(x) * erf), dtype=np.float64)


def predict_splits(
    num_prefill: F64,
    num_decode: F64,
    *,
    demand: Demand,
    model: ServiceModel,
    slo: SLOTargets,
    prefill_rate: float,
    queued_prefill_tokens: float = 0.0,
    backlog_horizon_s: float = 30.0,
    running_streams: float = 0.0,
    context_per_stream: float = 0.0,
    ttft_correction: float | F64 = 1.0,
) -> dict[str, F64]:
    """The model's figures for each candidate split (arrays of equal length): see
    ``controlplane.policies.planner``. ``prefill_rate`` is the mean per-instance prefill
    rate of the fleet; the prefill tokens already queued count as extra demand to drain
    within ``backlog_horizon_s`` (a momentary burst weighs little, a standing queue a lot)."""
    n_p = np.maximum(np.asarray(num_prefill, dtype=np.float64), _EPS)
    n_d = np.maximum(np.asarray(num_decode, dtype=np.float64), _EPS)
    lam = demand.requests_per_s
    # -- prefill: a G/G/1 queue per instance (M/D/1 for Poisson arrivals of equal prompts)
    mean_prompt = demand.prompt_tokens_per_s / lam if lam > 0 else 0.0
    service_s = mean_prompt / prefill_rate
    prefill_load = demand.prompt_tokens_per_s + queued_prefill_tokens / backlog_horizon_s
    rho_p = prefill_load / (n_p * prefill_rate)
    stable_p = rho_p < 1.0
    safe_rho = np.where(stable_p, rho_p, 0.5)
    burst = max(demand.arrival_scv, 0.1) * np.asarray(ttft_correction)  # effective c_a²
    # Kingman: the mean wait scales with v = (c_a² + c_s²)/2 (1/2 for M/D/1).
    variability = np.maximum((burst + demand.service_scv) / 2.0, 0.05)
    mean_wait = np.where(stable_p, safe_rho * service_s * variability / (1.0 - safe_rho), np.inf)
    # P(wait > 0): ρ for Poisson arrivals (PASTA); within bursts nearly everyone waits.
    p_wait = np.minimum(safe_rho * np.maximum(burst, 1.0), 1.0)
    slack = slo.ttft_s - service_s - model.kv_handoff_s
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        conditional_wait = np.maximum(mean_wait / np.maximum(p_wait, _EPS), _EPS)
        tail = np.where(
            slack >= 0, p_wait * np.exp(-np.maximum(slack, 0.0) / conditional_wait), 1.0
        )
    ttft_ok = np.where(stable_p & (slack >= 0), 1.0 - np.clip(tail, 0.0, 1.0), 0.0)
    # -- decode: Little's law on the ITL model
    beta = model.itl_per_seq_s + model.itl_per_context_token_s * context_per_stream
    per_instance = demand.output_tokens_per_s / n_d
    load_d = per_instance * beta
    stable_d = load_d < 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        steady = np.where(stable_d, per_instance * model.itl_base_s / (1.0 - load_d), np.inf)
    batch = np.maximum(steady, running_streams / n_d)
    max_batch = (slo.itl_s - model.itl_base_s) / beta if beta > 0 else math.inf
    itl = model.itl_base_s + beta * batch
    if math.isinf(max_batch):
        itl_ok = np.where(stable_d, 1.0, 0.0)
    else:
        with np.errstate(invalid="ignore"):  # an unstable split has batch = inf
            spread = np.sqrt(np.maximum(batch, 1.0))
            z = np.where(stable_d, (max_batch - batch) / spread, -40.0)
        itl_ok = np.where(stable_d, _normal_cdf(z), 0.0)
    goodput = lam * ttft_ok * itl_ok
    headroom = np.minimum(1.0 - rho_p, 1.0 - load_d)
    return {
        "num_prefill": np.asarray(num_prefill, dtype=np.float64),
        "num_decode": np.asarray(num_decode, dtype=np.float64),
        "goodput_rps": goodput,
        "ttft_attainment_ratio": ttft_ok,
        "itl_attainment_ratio": itl_ok,
        "prefill_utilisation_ratio": rho_p,
        "decode_batch": batch,
        "decode_max_batch": np.full_like(batch, max_batch),
        "itl_s": itl,
        "headroom_ratio": headroom,
    }


_CORRECTIONS = np.geomspace(1.0, 1024.0, 41)


def ttft_correction(
    observed: float | None, cur_p: float, cur_d: float, common: Mapping[str, Any]
) -> float:
    """The smallest factor on the arrivals' burstiness (1 to 1024, in steps of 2^¼) at
    which the current split's predicted TTFT attainment drops to the observed one: a
    correction like Dynamo's ``actual/expected``, for what the model misses (bursts beyond
    the measured ones, prompt-length tails). Only ever makes prefill look slower."""
    if observed is None or not math.isfinite(observed):
        return 1.0
    size = _CORRECTIONS.size
    predicted = predict_splits(
        np.full(size, cur_p), np.full(size, cur_d), ttft_correction=_CORRECTIONS, **common
    )["ttft_attainment_ratio"]
    if predicted[0] <= observed + 0.01:
        return 1.0
    below = np.nonzero(predicted <= observed)[0]
    return float(_CORRECTIONS[below[0] if below.size else size - 1])
