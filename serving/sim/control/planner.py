"""The PD planners in the cluster simulator: :class:`PlannerPolicy` runs our planner
(``controlplane.policies.planner``), :class:`DynamoPolicy` the Dynamo-style SLA planner
(``controlplane.policies.dynamo``), both as :class:`~serving.sim.cluster.policy.SimPolicy`
on the simulator's virtual clock — the same pure functions the control plane runs live.

What each observes (nothing the live control plane could not):

* demand — every request passes ``admit`` (the gateway's seam); the control plane's
  :class:`~controlplane.policies.planner_demand.DemandWindow` keeps the arrivals of the
  last ``window_s`` (30 s by default: after a workload shift, 60 s left the
  planner a window behind; measured on the evaluation's azure_conv shift, phase-2 goodput
  9.12 → 9.42 req/s with the same role changes under stationary load) — time, prompt
  tokens, ``max_tokens`` as the output length — and turns them into requests/s, prompt
  tokens/s and output tokens/s;
* load — the :class:`~serving.sim.cluster.policy.ClusterSnapshot`: per instance its role,
  the prefill tokens and decode streams the gateway counts on it; the context of a decode
  stream is estimated as the mean prompt plus half the mean output;
* capacities — the profile's latency model
  (:func:`serving.sim.control.profile.profile_params`, what Dynamo calls pre-deployment
  profiling) as the planner's :func:`~controlplane.policies.planner.service_model`. Our
  planner then corrects the decode step online by one factor, observed median ITL ÷ the
  profile's ITL at the observed decode batch (``learn=True``, the default);
* targets — the SLO's, by the control plane's rule
  (:func:`controlplane.policies.targets.slo_targets`).

Admission is delegated to ``admission`` (another SimPolicy, e.g. the adapter in
``serving.sim.control.admission``) when given, so one policy can run both loops; otherwise
every request is admitted.

Example::

    policy = PlannerPolicy(profile="h100-llama3.1-8b", objectives=options.objectives)
    Simulator(spec, workload, options, policy=policy).run()
    dynamo_180 = DynamoPolicy(interval_s=180.0); dynamo_5 = DynamoPolicy(interval_s=5.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from controlplane.policies.dynamo import DynamoConfig, DynamoObservation, DynamoPlanner
from controlplane.policies.dynamo import ServiceModelProfile as _Profile
from controlplane.policies.planner import (
    InstanceLoad,
    PlannerConfig,
    PlannerSnapshot,
    ServiceModel,
    SLOTargets,
    plan,
    service_model,
)
from controlplane.policies.planner_demand import DemandWindow
from controlplane.policies.targets import UNCONSTRAINED_S, slo_targets
from exporters.fleet import PoolRole
from exporters.slo import Metric, Objective
from serving.gateway.admission import ADMIT, Decision, RequestInfo
from serving.sim.cluster.policy import ClusterSnapshot, SimPolicy
from serving.sim.control.profile import DEFAULT_PROFILE, profile_params

__all__ = [
    "DEFAULT_OBJECTIVES",
    "DynamoPolicy",
    "PlannerPolicy",
    "observed_ttft_attainment",
]

DEFAULT_OBJECTIVES = (Objective(Metric.TTFT, 0.2), Objective(Metric.ITL, 0.05))


def _targets(objectives: Sequence[Objective]) -> SLOTargets:
    return slo_targets([objectives]) or SLOTargets(UNCONSTRAINED_S, UNCONSTRAINED_S)


def _observe(window: DemandWindow, info: RequestInfo) -> None:
    output = info.max_tokens if info.max_tokens is not None else 0
    window.add(info.arrival_s, info.prompt_tokens, output)


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
            role=view.role,
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
        objectives: Sequence[Objective] = DEFAULT_OBJECTIVES,
        interval_s: float = 5.0,
        window_s: float = 30.0,
        config: PlannerConfig | None = None,
        admission: SimPolicy | None = None,
        learn: bool = True,
    ) -> None:
        self.interval_s = interval_s
        self.profile = profile
        self.slo = _targets(objectives)
        self.config = config or PlannerConfig(min_dwell_s=30.0, max_moves_per_tick=1)
        self.arrivals = DemandWindow(window_s)
        self.admission = admission
        self.learn = learn
        self.decode_correction = 1.0
        self._changed: dict[str, float] = {}
        self.num_moves = 0
        self.last_reason = ""

    def admit(self, info: RequestInfo) -> Decision:
        _observe(self.arrivals, info)
        return ADMIT if self.admission is None else self.admission.admit(info)

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        if self.admission is not None:
            self.admission.plan(snapshot)  # its own bookkeeping; we own the roles
        now = snapshot.now_s
        demand = self.arrivals.demand(now)
        n, mean_prompt, mean_output = self.arrivals.means(now)
        if n == 0:
            return {}
        prior = service_model(profile_params(self.profile, prompt_tokens=mean_prompt))
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
        return result.roles()

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
        objectives: Sequence[Objective] = DEFAULT_OBJECTIVES,
        interval_s: float = 180.0,
        admission: SimPolicy | None = None,
    ) -> None:
        self.profile = profile
        slo = _targets(objectives)
        self.config = DynamoConfig(ttft_s=slo.ttft_s, itl_s=slo.itl_s, interval_s=interval_s)
        # The simulator calls plan() every interval_s; Dynamo acts once per interval too.
        self.interval_s = interval_s
        self.arrivals = DemandWindow(interval_s)
        self.admission = admission
        self._planner: DynamoPlanner | None = None
        self.num_moves = 0

    def admit(self, info: RequestInfo) -> Decision:
        _observe(self.arrivals, info)
        return ADMIT if self.admission is None else self.admission.admit(info)

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        if self.admission is not None:
            self.admission.plan(snapshot)
        now = snapshot.now_s
        n, isl, osl = self.arrivals.means(now)
        if n == 0:
            return {}
        # The profile at this interval's ISL.
        profile = _Profile(service_model(profile_params(self.profile, prompt_tokens=isl)))
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
        return dict(moves)


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
