"""The PD rebalancing planner: which split of instances between the prefill and decode
pools maximises predicted goodput, and which instances to move there. Pure: no I/O, the
clock is ``snapshot.now_s``; the control plane (``controlplane.runtime.planner``) and the
simulator (``serving.sim.control.planner``) run this same function.

**The model.** For a candidate split of ``n_p`` prefill and ``n_d`` decode instances, with
``λ`` requests/s arriving, ``P`` prompt tokens/s, ``O`` output tokens/s (the demand) and a
:class:`ServiceModel` (per-instance prefill rate ``r`` tokens/s, decode step time
``itl(b, C) = a + β·b + c·C`` for ``b`` running sequences holding ``C`` context tokens,
KV handoff ``h``):

* *TTFT* — each prefill instance is a single-server queue: arrivals ``λ/n_p``, service
  time ``D = (P/λ)/r`` (the mean prompt at the instance's rate), utilisation
  ``ρ_p = P/(n_p·r)``. The wait is 0 with probability ``1 − ρ_p`` and otherwise roughly
  exponential with mean ``v·D/(1 − ρ_p)``, where ``v = (c_a² + c_s²)/2`` (Kingman's
  G/G/1 factor: ``v = 1/2`` for Poisson arrivals of equal prompts, the M/D/1 mean wait
  ``ρD/(2(1 − ρ))``; bursty arrivals make it much larger), so
  ``P(TTFT > T) ≈ ρ_p·exp(−(1 − ρ_p)·s/(v·D))`` with slack ``s = T − D − h``.
  For bursty arrivals (``c_a² > 1``) the probability of waiting is ``min(1, ρ_p·c_a²)``
  rather than ``ρ_p`` (in a burst nearly everyone waits), the tail's mean scaled to keep
  the Kingman mean. Prefill tokens already queued count as extra demand to drain within
  ``backlog_horizon_s`` (``ρ_p = (P + Q/H)/(n_p·r)``), so a momentary burst weighs little
  and a standing queue a lot. ``ρ_p ≥ 1``: the queue grows without bound, 0.
* *ITL* — Little's law on a decode instance: ``b = (O/n_d)·itl(b)``, so
  ``b = (O/n_d)·a / (1 − (O/n_d)·β′)`` with ``β′ = β + c·ctx`` (``ctx``: context per
  sequence), or the running sequences observed now spread over ``n_d``, whichever is
  larger. The largest batch that meets the ITL target is ``b* = (T_itl − a)/β′``; the batch
  of an instance fluctuates like a Poisson count around ``b``, so
  ``P(ITL ≤ T_itl) ≈ Φ((b* − b)/√b)``. ``(O/n_d)·β′ ≥ 1``: decode cannot keep up, 0.
* *Goodput* ``= λ · P(TTFT ok) · P(ITL ok)`` (requests/s meeting both objectives; the two
  taken as independent).

Every candidate ``n_p`` is evaluated at once with numpy (columnar: O(N) for N instances).

**The decision.** The best split is the argmax (ties: the one nearest the current split).
The plan moves at most ``max_moves_per_tick`` instances toward it, and only when the
best split's predicted gain exceeds ``min_gain_ratio`` × current goodput (and
``min_gain_rps``) — hysteresis, so noise never moves anything. When every split predicts
no goodput at all (a deep overload that admission control must shed), the split with the
most headroom wins, under the same margin on headroom. An instance may move only when it
is not pinned, not draining, and its last role change is at least ``min_dwell_s`` old; of
those, the least loaded of the source pool move (fewest queued prefill tokens, or fewest
running sequences and least context), so the least work waits on a drain.

**Role changes.** A move is *drain from the old pool, then join the new*: the control plane
sends ``drain`` (the instance takes no new requests; in-flight work completes, nothing is
dropped), then ``set_role`` and ``resume`` once it reports drained (or the drain times out).
While it moves, an instance counts in its *target* pool (``InstanceLoad.moving_to``), never
in both and never twice. Where the KV connector lets the instance serve both roles
(``kv_both``: ``InstanceLoad.live_switch``), the switch is a routing change (``mode
"routing"``); otherwise the worker applies ``set_role`` by a supervised restart with the new
role (``mode "restart"``) — the plan says which, and the commands are the same.

**Capacities.** Live, the control plane learns them from ingested records with the
admission learner (``controlplane.policies.learning``) and passes them in the snapshot; the
simulator adapter starts from the fitted profile and corrects its decode step time by the
observed ITL (``serving.sim.control.planner``). The model's arithmetic is in
``controlplane.policies.planner_model``.

Example::

    snapshot = PlannerSnapshot(
        now_s=clock(), instances=views, demand=Demand(8.0, 16_000.0, 1_600.0),
        model=ServiceModel(20_000.0, 0.008, 0.0002, 2e-8), slo=SLOTargets(0.5, 0.05))
    result = plan(snapshot, PlannerConfig(max_moves_per_tick=1, min_dwell_s=60.0))
    for move in result.moves: ...  # drain, set_role, resume
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from controlplane.policies.planner_model import (
    Demand,
    ServiceModel,
    SLOTargets,
    check_positive,
    predict_splits,
    service_model,
    ttft_correction,
)
from exporters.fleet import PoolRole

__all__ = [
    "Demand",
    "InstanceLoad",
    "Move",
    "Plan",
    "PlannerConfig",
    "PlannerSnapshot",
    "SLOTargets",
    "ServiceModel",
    "SplitPrediction",
    "plan",
    "predict_splits",
    "service_model",
]

F64 = npt.NDArray[np.float64]
_EPS = 1e-12


@dataclass(frozen=True, slots=True)
class InstanceLoad:
    """One instance as the planner sees it.

    ``prefill_queue_tokens``: prompt tokens queued or prefilling on it;
    ``decode_streams`` / ``decode_context_tokens``: running sequences and the context they
    hold; ``prefill_tokens_per_s``: its learned prefill rate (``None``: the model's);
    ``draining``: it takes no new work; ``moving_to``: the pool a move in progress takes it
    to (it counts there); ``pinned``: an operator fixed its role; ``last_role_change_s``:
    when its role last changed (dwell time); ``live_switch``: its KV connector serves both
    roles, so a role change needs no restart.
    """

    id: str
    role: PoolRole
    prefill_queue_tokens: float = 0.0
    decode_streams: int = 0
    decode_context_tokens: float = 0.0
    prefill_tokens_per_s: float | None = None
    draining: bool = False
    moving_to: PoolRole | None = None
    pinned: bool = False
    last_role_change_s: float = -math.inf
    live_switch: bool = True


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    """Hysteresis (``min_gain_ratio`` of current goodput and ``min_gain_rps``), dwell
    time, moves per tick, the smallest pool the planner leaves, and the horizon over which
    queued prefill tokens count as demand."""

    min_gain_ratio: float = 0.05
    min_gain_rps: float = 0.0
    min_dwell_s: float = 60.0
    max_moves_per_tick: int = 1
    min_pool_size: int = 1
    backlog_horizon_s: float = 30.0

    def __post_init__(self) -> None:
        check_positive("backlog_horizon_s", self.backlog_horizon_s)
        check_positive("min_gain_ratio", self.min_gain_ratio, allow_zero=True)
        check_positive("min_gain_rps", self.min_gain_rps, allow_zero=True)
        check_positive("min_dwell_s", self.min_dwell_s, allow_zero=True)
        if not (isinstance(self.max_moves_per_tick, int) and self.max_moves_per_tick >= 1):
            raise ValueError(
                f"max_moves_per_tick must be an integer >= 1, got {self.max_moves_per_tick!r}"
            )
        if not (isinstance(self.min_pool_size, int) and self.min_pool_size >= 1):
            raise ValueError(f"min_pool_size must be an integer >= 1, got {self.min_pool_size!r}")


@dataclass(frozen=True, slots=True)
class PlannerSnapshot:
    """Everything one tick decides from; ``now_s`` is the injected clock."""

    now_s: float
    instances: Sequence[InstanceLoad]
    demand: Demand
    model: ServiceModel
    slo: SLOTargets
    observed_ttft_attainment_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class SplitPrediction:
    """The model's prediction for one split (see the module docstring)."""

    num_prefill: float
    num_decode: float
    goodput_rps: float
    ttft_attainment_ratio: float
    itl_attainment_ratio: float
    prefill_utilisation_ratio: float
    decode_batch: float
    decode_max_batch: float
    itl_s: float
    headroom_ratio: float

    def to_json(self) -> dict[str, float]:
        return {name: _finite(getattr(self, name)) for name in SplitPrediction.__dataclass_fields__}


def _finite(value: float) -> float:
    # JSON has no inf/nan: an unbounded figure is reported as a large number.
    if math.isnan(value):
        return 0.0
    return max(-1e18, min(1e18, float(value)))


@dataclass(frozen=True, slots=True)
class Move:
    """One instance to move: ``mode`` ``"routing"`` (kv_both: drain, set_role, resume) or
    ``"restart"`` (the worker restarts with the new role between drain and resume)."""

    instance_id: str
    from_role: PoolRole
    to_role: PoolRole
    mode: str
    evidence: Mapping[str, Any]
    predicted: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Plan:
    """One tick's decision: the moves (possibly none) and why."""

    now_s: float
    moves: tuple[Move, ...]
    current: SplitPrediction
    best: SplitPrediction
    target: SplitPrediction
    reason: str
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def roles(self) -> dict[str, PoolRole]:
        """``{instance id: new role}`` for the simulator's seam."""
        return {move.instance_id: move.to_role for move in self.moves}


def _pool_counts(instances: Sequence[InstanceLoad]) -> tuple[float, float]:
    """Effective prefill and decode sizes: a moving instance in its target pool, an
    operator-drained one nowhere, a ``both`` instance half in each."""
    num_p = num_d = 0.0
    for inst in instances:
        role = inst.moving_to if inst.moving_to is not None else inst.role
        if inst.draining and inst.moving_to is None:
            continue
        if role is PoolRole.PREFILL:
            num_p += 1.0
        elif role is PoolRole.DECODE:
            num_d += 1.0
        else:
            num_p += 0.5
            num_d += 0.5
    return num_p, num_d


def _at(figures: Mapping[str, F64], i: int) -> SplitPrediction:
    return SplitPrediction(**{name: float(values[i]) for name, values in figures.items()})


def _eligible(inst: InstanceLoad, now_s: float, config: PlannerConfig) -> bool:
    return (
        not inst.pinned
        and not inst.draining
        and inst.moving_to is None
        and inst.role is not PoolRole.BOTH
        and now_s - inst.last_role_change_s >= config.min_dwell_s
    )


def _mean_prefill_rate(instances: Sequence[InstanceLoad], default: float) -> float:
    rates = [i.prefill_tokens_per_s for i in instances if i.prefill_tokens_per_s]
    return float(np.mean(rates)) if rates else default


def plan(snapshot: PlannerSnapshot, config: PlannerConfig | None = None) -> Plan:
    """Decide one tick (see the module docstring). Pure and deterministic."""
    config = config or PlannerConfig()
    instances = snapshot.instances
    now = snapshot.now_s
    cur_p, cur_d = _pool_counts(instances)
    by_role: dict[PoolRole, list[InstanceLoad]] = {PoolRole.PREFILL: [], PoolRole.DECODE: []}
    for inst in instances:
        if _eligible(inst, now, config):
            by_role[inst.role].append(inst)
    counted = [i for i in instances if not (i.draining and i.moving_to is None)]
    prefill_side = [i for i in counted if (i.moving_to or i.role) is PoolRole.PREFILL]
    decode_side = [i for i in counted if (i.moving_to or i.role) is PoolRole.DECODE]
    queued = float(sum(i.prefill_queue_tokens for i in prefill_side))
    streams = float(sum(i.decode_streams for i in decode_side))
    context = float(sum(i.decode_context_tokens for i in decode_side))
    demand = snapshot.demand
    if streams > 0:
        context_per_stream = context / streams
    elif demand.requests_per_s > 0:  # prompt plus half the output, on average
        context_per_stream = (
            demand.prompt_tokens_per_s + 0.5 * demand.output_tokens_per_s
        ) / demand.requests_per_s
    else:
        context_per_stream = 0.0
    rate = _mean_prefill_rate(instances, snapshot.model.prefill_tokens_per_s)
    # Candidate splits: every shift from -(movable prefill) to +(movable decode).
    low = -min(len(by_role[PoolRole.PREFILL]), max(math.floor(cur_p) - config.min_pool_size, 0))
    high = min(len(by_role[PoolRole.DECODE]), max(math.floor(cur_d) - config.min_pool_size, 0))
    shifts = np.arange(low, high + 1, dtype=np.int64)
    common = {
        "demand": demand,
        "model": snapshot.model,
        "slo": snapshot.slo,
        "prefill_rate": rate,
        "queued_prefill_tokens": queued,
        "backlog_horizon_s": config.backlog_horizon_s,
        "running_streams": streams,
        "context_per_stream": context_per_stream,
    }
    correction = ttft_correction(snapshot.observed_ttft_attainment_ratio, cur_p, cur_d, common)
    figures = predict_splits(
        (cur_p + shifts).astype(np.float64),
        (cur_d - shifts).astype(np.float64),
        ttft_correction=correction,
        **common,  # type: ignore[arg-type]
    )
    zero = int(-low)
    goodput = figures["goodput_rps"]
    current = _at(figures, zero)
    evidence: dict[str, Any] = {
        "now_s": now,
        "demand": {
            "requests_per_s": demand.requests_per_s,
            "prompt_tokens_per_s": demand.prompt_tokens_per_s,
            "output_tokens_per_s": demand.output_tokens_per_s,
        },
        "model": snapshot.model.to_json(),
        "slo": {"ttft_s": snapshot.slo.ttft_s, "itl_s": snapshot.slo.itl_s},
        "pools": {"prefill": cur_p, "decode": cur_d},
        "queued_prefill_tokens": queued,
        "backlog_horizon_s": config.backlog_horizon_s,
        "running_streams": streams,
        "context_per_stream": context_per_stream,
        "prefill_rate_tokens_per_s": rate,
        "ttft_correction": correction,
        "observed_ttft_attainment_ratio": snapshot.observed_ttft_attainment_ratio,
        "movable": {
            "prefill": len(by_role[PoolRole.PREFILL]),
            "decode": len(by_role[PoolRole.DECODE]),
        },
    }
    if demand.requests_per_s <= 0:
        return Plan(now, (), current, current, current, "no demand", evidence)
    distance = np.abs(shifts).astype(np.float64)
    if float(goodput.max()) > _EPS:
        # Argmax, ties to the nearest split: a lexicographic key on (goodput, -distance).
        best_i = int(np.lexsort((distance, -goodput))[0])
        score, current_score = goodput, current.goodput_rps
        margin = max(config.min_gain_rps, config.min_gain_ratio * current_score)
        unit = "goodput_rps"
    else:  # nothing meets the SLO anywhere: keep the most headroom
        headroom = figures["headroom_ratio"]
        best_i = int(np.lexsort((distance, -headroom))[0])
        score, current_score = headroom, current.headroom_ratio
        margin = max(config.min_gain_ratio, 0.0)
        unit = "headroom_ratio"
    best = _at(figures, best_i)
    step = int(shifts[best_i])
    if step == 0:
        return Plan(
            now, (), current, best, current, "current split is the best predicted", evidence
        )
    step = max(-config.max_moves_per_tick, min(config.max_moves_per_tick, step))
    target_i = zero + step
    target = _at(figures, target_i)
    # Hysteresis on the best split's gain: a plateau between here and there (splits that
    # all miss the SLO) must not hide a real gain k moves away.
    gain = float(score[best_i] - current_score)
    if gain <= margin:
        reason = f"predicted gain {gain:.4g} {unit} within the margin {margin:.4g}: no move"
        return Plan(now, (), current, best, current, reason, evidence)
    source = PoolRole.DECODE if step > 0 else PoolRole.PREFILL
    destination = PoolRole.PREFILL if step > 0 else PoolRole.DECODE
    if source is PoolRole.PREFILL:
        key = lambda i: (i.prefill_queue_tokens, i.decode_streams, i.id)  # noqa: E731
    else:
        key = lambda i: (i.decode_streams, i.decode_context_tokens, i.id)  # noqa: E731
    chosen = sorted(by_role[source], key=key)[: abs(step)]
    predicted = {
        "before": current.to_json(),
        "after": target.to_json(),
        "goodput_gain_rps": target.goodput_rps - current.goodput_rps,
        "best": best.to_json(),
    }
    moves = tuple(
        Move(
            instance_id=inst.id,
            from_role=source,
            to_role=destination,
            mode="routing" if inst.live_switch else "restart",
            evidence={
                "prefill_queue_tokens": inst.prefill_queue_tokens,
                "decode_streams": inst.decode_streams,
                "decode_context_tokens": inst.decode_context_tokens,
                "last_role_change_s": _finite(inst.last_role_change_s),
                "chosen_as": f"least loaded of {len(by_role[source])} movable {source.value}",
            },
            predicted=predicted,
        )
        for inst in chosen
    )
    reason = (
        f"move {len(moves)} {source.value}→{destination.value}: predicted {unit} "
        f"{float(current_score):.4g} → {float(score[target_i]):.4g} (best split "
        f"{best.num_prefill:g}P:{best.num_decode:g}D)"
    )
    return Plan(now, moves, current, best, target, reason, evidence)
