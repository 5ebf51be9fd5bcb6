"""The PD planners in the cluster simulator: :class:`PlannerPolicy` runs our planner
(``controlplane.policies.planner``), :class:`DynamoPolicy` the Dynamo-style SLA planner
(``controlplane.policies.dynamo``), both as :class:`~serving.sim.cluster.policy.SimPolicy`
on the simulator's virtual clock — the same pure functions the control plane runs live.

What each observes (nothing the live control plane could not):

* demand — every request passes ``admit`` (the gateway's seam); the adapter keeps the
  arrivals of the last ``window_s`` (30 s by default: after a workload shift, 60 s left the
  planner a window behind; measured on the evaluation's azure_conv shift, phase-2 goodput
  9.12 → 9.42 req/s with the same role changes under stationary load) — time, prompt
  tokens, ``max_tokens`` as the output length — and turns them into requests/s, prompt
  tokens/s and output tokens/s;
* load — the :class:`~serving.sim.cluster.policy.ClusterSnapshot`: per instance its role,
  the prefill tokens and decode streams the gateway counts on it; the context of a decode
  stream is estimated as the mean prompt plus half the mean output;
* capacities — the profile's fitted step times (what Dynamo calls pre-deployment
  profiling): the prefill rate at the observed mean prompt in full batches, the decode step
  ``base + per_seq·b + per_token·C`` below the knee, the KV handoff over NVLink. Our
  planner then corrects the decode step online by one factor, observed median ITL ÷ the
  profile's ITL at the observed decode batch (``learn=True``, the default).

Admission is delegated to ``admission`` (another SimPolicy, e.g. the adapter in
``serving.sim.control.admission``) when given, so one policy can run both loops; otherwise
every request is admitted.

Example::

    policy = PlannerPolicy(profile="h100-llama3.1-8b", ttft_s=0.2, itl_s=0.05)
    Simulator(spec, workload, options, policy=policy).run()
    dynamo_180 = DynamoPolicy(interval_s=180.0); dynamo_5 = DynamoPolicy(interval_s=5.0)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controlplane.policies.dynamo import DynamoConfig, DynamoObservation, DynamoPlanner
from controlplane.policies.dynamo import ServiceModelProfile as _Profile
from controlplane.policies.planner import (
    Demand,
    InstanceLoad,
    PlannerConfig,
    PlannerSnapshot,
    ServiceModel,
    SLOTargets,
    plan,
)
from exporters.commands import Role
from serving.gateway.admission import ADMIT, Decision, RequestInfo
from serving.gateway.routing import PoolRole
from serving.sim.cluster.policy import ClusterSnapshot, SimPolicy
from serving.sim.kv import get_link
from serving.sim.latency_model import LatencyModel

__all__ = [
    "ArrivalWindow",
    "DynamoPolicy",
    "PlannerPolicy",
    "observed_ttft_attainment",
    "service_model",
]

DEFAULT_PROFILE = "h100-llama3.1-8b"
_BATCH_TOKENS = 8192  # the instance model's default max_num_batched_tokens


def service_model(latency: LatencyModel, mean_prompt_tokens: float) -> ServiceModel:
    """The planner's :class:`ServiceModel` from a fitted profile, at ``mean_prompt_tokens``."""
    prompt = max(1, round(mean_prompt_tokens))
    per_batch = max(1, _BATCH_TOKENS // prompt)
    rate = per_batch * prompt / latency.prefill_s(np.full(per_batch, prompt))
    decode = latency.profile.decode
    link = get_link("nvlink")
    handoff = link.setup_s + prompt * latency.kv_bytes_per_token_per_gpu / link.bytes_per_s
    return ServiceModel(
        prefill_tokens_per_s=rate,
        itl_base_s=decode.base_s,
        itl_per_seq_s=decode.per_unit_s,
        itl_per_context_token_s=decode.per_attention_unit_s,
        kv_handoff_s=handoff,
    )


@dataclass(frozen=True, slots=True)
class _Arrival:
    time_s: float
    prompt_tokens: int
    output_tokens: int


class ArrivalWindow:
    """The arrivals of the last ``window_s`` virtual seconds and their rates."""

    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.window_s = window_s
        self._items: deque[_Arrival] = deque()
        self._prompt = 0
        self._output = 0
        self._first_s: float | None = None

    def add(self, info: RequestInfo) -> None:
        output = info.max_tokens if info.max_tokens is not None else 0
        self._items.append(_Arrival(info.arrival_s, info.prompt_tokens, output))
        self._prompt += info.prompt_tokens
        self._output += output
        if self._first_s is None:
            self._first_s = info.arrival_s

    def _trim(self, now_s: float) -> None:
        while self._items and self._items[0].time_s < now_s - self.window_s:
            old = self._items.popleft()
            self._prompt -= old.prompt_tokens
            self._output -= old.output_tokens

    def demand(self, now_s: float) -> Demand:
        self._trim(now_s)
        if self._first_s is None or not self._items:
            return Demand(0.0, 0.0, 0.0)
        span = max(min(self.window_s, now_s - self._first_s), 1.0)
        n = len(self._items)
        arrival_scv = service_scv = 1.0
        if n >= 3:
            times = np.fromiter((a.time_s for a in self._items), np.float64, n)
            prompts = np.fromiter((a.prompt_tokens for a in self._items), np.float64, n)
            arrival_scv = _scv(np.diff(times))
            service_scv = _scv(prompts)
        return Demand(
            n / span,
            self._prompt / span,
            self._output / span,
            arrival_scv=arrival_scv,
            service_scv=service_scv,
        )

    def means(self, now_s: float) -> tuple[int, float, float]:
        """Arrivals in the window, mean prompt and mean output tokens."""
        self._trim(now_s)
        n = len(self._items)
        return n, self._prompt / max(n, 1), self._output / max(n, 1)


def _scv(values: npt.NDArray[np.float64]) -> float:
    """Squared coefficient of variation (1.0 when it cannot be told)."""
    mean = float(values.mean()) if values.size else 0.0
    return float(values.var() / (mean * mean)) if mean > 0 else 1.0


def observed_ttft_attainment(snapshot: ClusterSnapshot) -> float | None:
    """The share of the last minute's judged requests that met their TTFT objective(s)
    (``None`` before any was judged)."""
    for stats in snapshot.goodput:
        if stats.requests > 0:
            missed = sum(v for k, v in stats.violations.items() if k.startswith("ttft"))
            return 1.0 - min(missed, stats.requests) / stats.requests
    return None


def _instances(
    snapshot: ClusterSnapshot, context_per_stream: float, changed: Mapping[str, float]
) -> list[InstanceLoad]:
    return [
        InstanceLoad(
            id=view.id,
            role=Role(view.role.value),
            prefill_queue_tokens=float(view.prefill_tokens),
            decode_streams=view.decode_streams,
            decode_context_tokens=view.decode_streams * context_per_stream,
            last_role_change_s=changed.get(view.id, -math.inf),
        )
        for view in snapshot.instances
    ]


class PlannerPolicy:
    """Our planner as a SimPolicy (see the module docstring)."""

    def __init__(
        self,
        *,
        profile: str = DEFAULT_PROFILE,
        ttft_s: float = 0.2,
        itl_s: float = 0.05,
        interval_s: float = 5.0,
        window_s: float = 30.0,
        config: PlannerConfig | None = None,
        admission: SimPolicy | None = None,
        learn: bool = True,
    ) -> None:
        self.interval_s = interval_s
        self.latency = LatencyModel.for_profile(profile)
        self.slo = SLOTargets(ttft_s=ttft_s, itl_s=itl_s)
        self.config = config or PlannerConfig(min_dwell_s=30.0, max_moves_per_tick=1)
        self.arrivals = ArrivalWindow(window_s)
        self.admission = admission
        self.learn = learn
        self.decode_correction = 1.0
        self._changed: dict[str, float] = {}
        self.num_moves = 0
        self.last_reason = ""

    def admit(self, info: RequestInfo) -> Decision:
        self.arrivals.add(info)
        return ADMIT if self.admission is None else self.admission.admit(info)

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        if self.admission is not None:
            self.admission.plan(snapshot)  # its own bookkeeping; we own the roles
        now = snapshot.now_s
        demand = self.arrivals.demand(now)
        n, mean_prompt, mean_output = self.arrivals.means(now)
        if n == 0:
            return {}
        prior = service_model(self.latency, mean_prompt)
        context = mean_prompt + 0.5 * mean_output
        model = self._model(prior, snapshot, context)
        result = plan(
            PlannerSnapshot(
                now_s=now,
                instances=_instances(snapshot, context, self._changed),
                demand=demand,
                model=model,
                slo=self.slo,
                observed_ttft_attainment_ratio=observed_ttft_attainment(snapshot),
            ),
            self.config,
        )
        self.last_reason = result.reason
        for move in result.moves:
            self._changed[move.instance_id] = now
        self.num_moves += len(result.moves)
        return {move.instance_id: PoolRole(move.to_role.value) for move in result.moves}

    def _model(
        self, prior: ServiceModel, snapshot: ClusterSnapshot, context: float
    ) -> ServiceModel:
        """The profile's model, its decode step scaled by the learned correction: an
        exponentially weighted mean (weight 0.2) of observed median ITL ÷ the ITL the
        profile predicts at the observed decode batch, kept within [0.5, 4] (like Dynamo's
        ``decode_correction``; one factor, so a batch that hardly varies cannot make it
        diverge)."""
        if not self.learn:
            return prior
        decode = [v for v in snapshot.instances if v.role is PoolRole.DECODE]
        streams = sum(v.decode_streams for v in decode)
        itl = next((s.itl.p50_s for s in snapshot.goodput if s.itl.p50_s is not None), None)
        if decode and streams and itl is not None:
            batch = streams / len(decode)
            ratio = itl / prior.itl_s(batch, batch * context)
            self.decode_correction = min(4.0, max(0.5, 0.8 * self.decode_correction + 0.2 * ratio))
        k = self.decode_correction
        return ServiceModel(
            prefill_tokens_per_s=prior.prefill_tokens_per_s,
            itl_base_s=prior.itl_base_s * k,
            itl_per_seq_s=prior.itl_per_seq_s * k,
            itl_per_context_token_s=prior.itl_per_context_token_s * k,
            kv_handoff_s=prior.kv_handoff_s,
        )


class DynamoPolicy:
    """The Dynamo-style SLA planner as a SimPolicy: every ``interval_s`` (180 s by
    default, as Dynamo) it reads the interval's arrivals (count, mean ISL and OSL), the
    goodput engine's mean-ish TTFT and ITL (the medians) and the mean decode batch, and
    splits the fleet by Dynamo's formulas."""

    def __init__(
        self,
        *,
        profile: str = DEFAULT_PROFILE,
        ttft_s: float = 0.2,
        itl_s: float = 0.05,
        interval_s: float = 180.0,
        admission: SimPolicy | None = None,
    ) -> None:
        self.latency = LatencyModel.for_profile(profile)
        self.config = DynamoConfig(ttft_s=ttft_s, itl_s=itl_s, interval_s=interval_s)
        # The simulator calls plan() every interval_s; Dynamo acts once per interval too.
        self.interval_s = interval_s
        self.arrivals = ArrivalWindow(interval_s)
        self.admission = admission
        self._planner: DynamoPlanner | None = None
        self.num_moves = 0

    def admit(self, info: RequestInfo) -> Decision:
        self.arrivals.add(info)
        return ADMIT if self.admission is None else self.admission.admit(info)

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        if self.admission is not None:
            self.admission.plan(snapshot)
        now = snapshot.now_s
        n, isl, osl = self.arrivals.means(now)
        if n == 0:
            return {}
        profile = _Profile(service_model(self.latency, isl))  # at this interval's ISL
        if self._planner is None:
            self._planner = DynamoPlanner(profile, self.config)
        planner = self._planner
        planner.profile = profile
        stats = snapshot.goodput[0] if snapshot.goodput else None
        decode = [v for v in snapshot.instances if v.role is PoolRole.DECODE]
        batch = sum(v.decode_streams for v in decode) / len(decode) if decode else None
        obs = DynamoObservation(
            num_requests=float(n),
            duration_s=min(self.interval_s, max(now, 1.0)),
            isl=isl,
            osl=osl,
            ttft_s=None if stats is None else stats.ttft.p50_s,
            itl_s=None if stats is None else stats.itl.p50_s,
            decode_batch=batch if batch else None,
        )
        context = isl + 0.5 * osl
        moves = planner.plan(now, _instances(snapshot, context, {}), obs)
        self.num_moves += len(moves)
        return {k: PoolRole(v.value) for k, v in moves.items()}


def _compare(argv: list[str] | None = None) -> None:
    """``python -m serving.sim.control.planner``: one trace and cluster under no control, our
    planner and the Dynamo-style planner (180 s and a short interval); one line each."""
    import argparse
    import json

    from serving.sim.cluster import SimOptions, Simulator, build_workload, parse_cluster
    from serving.sim.cluster.policy import NoControl
    from serving.traces import load_trace

    parser = argparse.ArgumentParser(description=_compare.__doc__)
    parser.add_argument("--trace", default="azure_code")
    parser.add_argument("--rate-scale", type=float, default=2.0)
    parser.add_argument("--cluster", default="prefill=1,decode=7,model=llama3.1-8b")
    parser.add_argument("--duration", type=float, default=600.0)
    parser.add_argument("--short-interval", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    policies: list[tuple[str, SimPolicy]] = [
        ("none", NoControl()),
        ("planner", PlannerPolicy()),
        ("dynamo_180s", DynamoPolicy(interval_s=180.0)),
        (f"dynamo_{args.short_interval:g}s", DynamoPolicy(interval_s=args.short_interval)),
    ]
    for name, policy in policies:
        work = build_workload(trace, rate_scale=args.rate_scale, duration_s=args.duration)
        spec = parse_cluster(args.cluster)
        stats = Simulator(spec, work, SimOptions(seed=args.seed), policy=policy).run().stats
        row = {
            "policy": name,
            "goodput_rps": round(stats.goodput_rps, 3),
            "attainment_ratio": None
            if stats.attainment_ratio is None
            else round(stats.attainment_ratio, 4),
            "role_changes": getattr(policy, "num_moves", 0),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    _compare()
