"""The admission policy the control plane pushes to gateways, as a pure function.

:func:`compute_policy` turns what the control plane knows — the learned latency model
(:class:`~controlplane.policies.learning.LearnedParams`), the SLO registry (the engine's
:class:`~controlplane.goodput.SLOSpec` set) and each SLO's current burn rate — into an
:class:`exporters.admission.AdmissionPolicy`. No clock, no I/O: the runtime
(``controlplane.runtime.admission``) calls it and ships the result; the simulator's
adapter (``serving.sim.control.admission``) calls it too.

* **Per SLO**: the allowed TTFT and ITL are the SLO's targets
  (:mod:`controlplane.policies.targets`: the tightest TTFT objective; the tightest ITL or
  TPOT objective). The key is the value the gateway puts
  in its ``slo`` label: the SLO's ``slo`` selector, else its ``tenant`` selector (the
  gateway labels a request with its tenant when no ``x-goodput-slo`` header names one),
  else the SLO's name.
* **Burn rate → margin**: while an SLO burns its error budget faster than it accrues
  (burn rate > 1) the allowed latency shrinks, so admission sheds earlier and the budget
  recovers: ``margin = max(min_margin_ratio, 1 / (1 + burn_sensitivity·(burn − 1)))``.
  Where several SLOs share a key the tightest wins.
* **Infeasible requests**: each SLO's ``infeasible`` choice (``"admit"`` or ``"reject"``)
  travels as is; the gateway calls a request infeasible when its TTFT on an idle instance
  exceeds the TTFT objective (docs/admission.md). Where several SLOs share a key, one
  that rejects makes the key reject.
* **Max decode batch**: the largest batch whose predicted ITL (the learned model at the
  mean context) meets the strictest ITL objective, capped by ``max_decode_batch``.
* **Classes**: ``critical`` is never shed, ``standard`` may use all the allowed latency,
  ``sheddable`` only ``sheddable_headroom_ratio`` of it (so it goes first) — configurable.
* **Availability floor** (the guard against starving one prompt-length class): the
  policy carries ``prompt_class_bounds`` (the config's, or those the caller passes, e.g.
  the quartiles of the prompts seen: :func:`prompt_quartiles`) and ``availability_floor``
  (default 0.5); the gateway admits a request the prediction refuses while its class's
  availability is below the floor × the availability of all classes together. Without
  bounds there is one class and no guard.
* **Several gateways** (:func:`gateway_shares`): each live gateway gets its share of the
  fleet's capacity, ``share_ratio``, in proportion to the requests per second offered to
  it (its heartbeat's ``offered_rps``), blended with an equal split by
  ``gateway_share_floor_ratio`` so a gateway that reported no traffic still holds a little;
  the shares sum to 1, so the gateways together admit what one would (docs/scale-out.md).

Example::

    policy = compute_policy(learner.params(), engine.slos, {"chat": 2.5},
                            AdmissionConfig(), version=12)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.goodput.spec import SLOSpec
from controlplane.policies.learning import LearnedParams
from controlplane.policies.targets import itl_target_s, ttft_target_s
from exporters.admission import AdmissionModel, AdmissionPolicy, ClassPolicy, SLOAdmission

__all__ = [
    "DEFAULT_CLASSES",
    "MIN_SHARE_RATIO",
    "AdmissionConfig",
    "compute_policy",
    "gateway_shares",
    "margin_ratio",
    "max_batch",
    "prompt_quartiles",
    "slo_key",
]

#: The smallest share a gateway gets (one with no traffic, where the floor is 0).
MIN_SHARE_RATIO = 1e-6

DEFAULT_CLASSES: Mapping[str, ClassPolicy] = {
    "critical": ClassPolicy(shed_order=2, sheddable=False),
    "standard": ClassPolicy(shed_order=1, headroom_ratio=1.0),
    "sheddable": ClassPolicy(shed_order=0, headroom_ratio=0.7),
}


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """How the control plane shapes the policy (``Settings`` fills it)."""

    ttl_s: float = 30.0
    fallback_max_concurrency: int = 256
    classes: Mapping[str, ClassPolicy] = field(default_factory=lambda: dict(DEFAULT_CLASSES))
    burn_sensitivity: float = 0.25
    min_margin_ratio: float = 0.5
    max_decode_batch: int = 256
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    over_share_ratio: float = 0.8
    availability_floor: float = 0.5
    prompt_class_bounds: tuple[int, ...] = ()
    gateway_share_floor_ratio: float = 0.1

    def __post_init__(self) -> None:
        if not (
            math.isfinite(self.gateway_share_floor_ratio)
            and 0 <= self.gateway_share_floor_ratio <= 1
        ):
            raise ValueError(
                "gateway_share_floor_ratio must be in [0, 1], got "
                f"{self.gateway_share_floor_ratio!r}"
            )
        if not (math.isfinite(self.availability_floor) and 0 <= self.availability_floor < 1):
            raise ValueError(
                f"availability_floor must be in [0, 1), got {self.availability_floor!r}"
            )
        if not (math.isfinite(self.burn_sensitivity) and self.burn_sensitivity >= 0):
            raise ValueError(f"burn_sensitivity must be >= 0, got {self.burn_sensitivity!r}")
        if not 0 < self.min_margin_ratio <= 1:
            raise ValueError(f"min_margin_ratio must be in (0, 1], got {self.min_margin_ratio!r}")
        if self.max_decode_batch < 1:
            raise ValueError(f"max_decode_batch must be >= 1, got {self.max_decode_batch!r}")


def margin_ratio(burn_rate: float | None, config: AdmissionConfig) -> float:
    """The factor on an SLO's allowed latency at this burn rate (1 while it is ≤ 1)."""
    if burn_rate is None or math.isnan(burn_rate) or burn_rate <= 1.0:
        return 1.0  # unknown (nothing judged yet) or within budget
    if math.isinf(burn_rate):
        return config.min_margin_ratio
    return max(config.min_margin_ratio, 1.0 / (1.0 + config.burn_sensitivity * (burn_rate - 1.0)))


def slo_key(spec: SLOSpec) -> str:
    """The gateway ``slo`` label value that selects ``spec`` (see the module docstring)."""
    return spec.selector.get("slo") or spec.selector.get("tenant") or spec.name


def compute_policy(
    params: LearnedParams,
    slos: Sequence[SLOSpec],
    burn_rates: Mapping[str, float | None],
    config: AdmissionConfig,
    *,
    version: int,
    prompt_class_bounds: Sequence[int] | None = None,
) -> AdmissionPolicy:
    """The admission policy for this model, SLO set and burn rates (keyed by SLO id);
    ``prompt_class_bounds`` replaces the config's."""
    entries: dict[str, SLOAdmission] = {}
    for spec in slos:
        burn = burn_rates.get(spec.id)
        entry = SLOAdmission(
            ttft_s=ttft_target_s(spec.objectives),
            itl_s=itl_target_s(spec.objectives),
            burn_rate=burn if burn is not None and math.isfinite(burn) and burn >= 0 else 0.0,
            margin_ratio=margin_ratio(burn, config),
            infeasible=spec.infeasible,
        )
        key = slo_key(spec)
        other = entries.get(key)
        if other is not None:  # several SLOs on one label value: the tightest of each
            entry = SLOAdmission(
                ttft_s=_min(entry.ttft_s, other.ttft_s),
                itl_s=_min(entry.itl_s, other.itl_s),
                burn_rate=max(entry.burn_rate, other.burn_rate),
                margin_ratio=min(entry.margin_ratio, other.margin_ratio),
                # One SLO that refuses infeasible requests refuses them for its key.
                infeasible=max(entry.infeasible, other.infeasible),  # "reject" > "admit"
            )
        entries[key] = entry
    itl_targets = [e.itl_s for e in entries.values() if e.itl_s is not None]
    bounds = tuple(
        config.prompt_class_bounds if prompt_class_bounds is None else prompt_class_bounds
    )
    return AdmissionPolicy(
        version=version,
        ttl_s=config.ttl_s,
        fallback_max_concurrency=config.fallback_max_concurrency,
        classes=config.classes,
        slos=entries,
        model=AdmissionModel(
            prefill_tokens_per_s=params.prefill_tokens_per_s,
            kv_handoff_s=params.kv_handoff_s,
            itl_base_s=params.itl_base_s,
            itl_per_stream_s=params.itl_per_stream_s,
            itl_per_context_token_s=params.itl_per_context_token_s,
            max_decode_batch=max_batch(params, min(itl_targets, default=None), config),
            mean_decode_s=params.mean_decode_s,
            mean_context_tokens=params.mean_context_tokens,
        ),
        tenant_weights=config.tenant_weights,
        over_share_ratio=config.over_share_ratio,
        prompt_class_bounds=bounds,
        # One class (no bounds): the floor could never bind, so the policy omits it.
        availability_floor=config.availability_floor if bounds else 0.0,
    )


def gateway_shares(
    offered_rps: Mapping[str, float | None], *, floor_ratio: float = 0.1
) -> dict[str, float]:
    """Each gateway's share of the fleet's capacity, from the requests per second offered
    to it (``None``: not reported, e.g. a gateway that predates the report; it counts as
    the mean of those reported).

    ``share = (1 − floor_ratio) · rate ÷ Σ rates + floor_ratio ÷ N``: proportional to the
    offered rates (a load balancer's spread, even or not), blended with an equal split so
    that a gateway reported idle (or not yet reported: heartbeats lag) keeps
    ``floor_ratio ÷ N`` and is not refused everything until the next policy. An equal
    split where no gateway reported traffic. The shares sum to 1 (rounding aside) and each
    is in (0, 1]; one gateway gets 1."""
    if not (math.isfinite(floor_ratio) and 0 <= floor_ratio <= 1):
        raise ValueError(f"floor_ratio must be in [0, 1], got {floor_ratio!r}")
    n = len(offered_rps)
    if n <= 1:  # exactly 1 (not 1 − ε from the blend): a lone gateway's policy reads as before
        return dict.fromkeys(offered_rps, 1.0)
    reported = [
        float(r) for r in offered_rps.values() if r is not None and math.isfinite(r) and r >= 0
    ]
    mean = sum(r / len(reported) for r in reported) if reported else 0.0  # no overflow
    rates = {
        g: float(r) if r is not None and math.isfinite(r) and r >= 0 else mean
        for g, r in offered_rps.items()
    }
    peak = max(rates.values())
    if peak <= 0:
        return dict.fromkeys(rates, 1.0 / n)
    # Each rate as a fraction of the largest first: neither the sum overflows (rates near
    # the float maximum) nor a product underflows (subnormal rates) before the division.
    scaled = {g: r / peak for g, r in rates.items()}
    total = sum(scaled.values())  # in [1, n]
    even = floor_ratio / n
    shares = {g: (1.0 - floor_ratio) * (r / total) + even for g, r in scaled.items()}
    # A share must be > 0 (an idle gateway with floor 0): at least MIN_SHARE_RATIO.
    return {g: min(1.0, max(s, MIN_SHARE_RATIO)) for g, s in shares.items()}


def prompt_quartiles(prompt_tokens: Sequence[int]) -> tuple[int, ...]:
    """Prompt-class bounds at the quartiles of ``prompt_tokens`` (the lower median, rounded
    to whole tokens; repeated values merged, so fewer than three bounds on a workload with
    few distinct lengths; none for an empty one)."""
    values = sorted(int(p) for p in prompt_tokens)
    n = len(values)
    if n == 0:
        return ()
    cuts = (values[max(0, math.ceil(q * n) - 1)] for q in (0.25, 0.5, 0.75))
    return tuple(sorted({max(1, c) for c in cuts if c < values[-1]}))


def max_batch(params: LearnedParams, itl_s: float | None, config: AdmissionConfig) -> int:
    """The largest decode batch whose predicted ITL at the mean context is ≤ ``itl_s``
    (``config.max_decode_batch`` without an ITL target or when the model allows more);
    at least 1."""
    if itl_s is None:
        return config.max_decode_batch
    per_stream = params.itl_per_stream_s + params.itl_per_context_token_s * (
        params.mean_context_tokens
    )
    room = itl_s - params.itl_base_s
    if per_stream <= 0:
        return config.max_decode_batch if room >= 0 else 1
    return int(min(config.max_decode_batch, max(1.0, math.floor(room / per_stream))))


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
