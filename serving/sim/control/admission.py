"""The gateway's SLO-aware admission rule as a simulator policy (``SimPolicy``).

:class:`SimAdmission` runs the very rule the gateway runs
(:class:`serving.gateway.admission_policy.PolicyAdmission`) on the simulator's virtual
clock, with the policy the control plane would push, computed by the control plane's own
:func:`controlplane.policies.admission.compute_policy` from:

* **model** — the latency model the control plane learns online, read here from the
  cluster's profile (:func:`serving.sim.control.profile.profile_params`) at the mean prompt
  and output lengths of the requests seen so far and the decode batch of the last snapshot;
* **SLO** — the simulator's one SLO (:func:`serving.sim.cluster.simulator.slo_spec`) with
  the scenario's objectives; the simulator's requests carry no ``slo`` label, so they get
  that SLO's key. Its burn rate is the goodput engine's over the last minute
  (``snapshot.goodput``), as the control plane's is; ``infeasible`` is the SLO's choice
  for requests that cannot meet the TTFT objective even on an idle instance (``"admit"``,
  the default, or ``"reject"``; the rule's counts are in ``rule.num_infeasible``);
* **load** — a :class:`~serving.gateway.admission_load.LoadTracker` rebuilt from each
  snapshot (every ``interval_s`` of virtual time: the instances' queued prefill tokens and
  decode streams as the simulated gateway counts them, the requests waiting or running on
  prefill instances), and moved between snapshots by the requests it admits (each one
  queues on the least-loaded prefill instance, as routing sends it there).

* **prompt classes** — the availability floor's prompt-length classes are the quartiles of
  the prompts seen so far (:func:`~controlplane.policies.admission.prompt_quartiles`,
  recomputed as the count grows by a quarter or by 1 000), as a control plane would learn
  them; the floor is the config's (``AdmissionConfig.availability_floor``).

The simulator's requests have no priority class, so they all get the default class (full
headroom), and the rule keeps no room for never-shed traffic (there is none). ``plan``
never moves an instance: combine it with a planner
(``serving.sim.experiments.contenders.Combined``).

Example::

    policy = SimAdmission(profile="h100-llama3.1-8b", objectives=options.objectives)
    result = Simulator(spec, workload, options, policy=policy).run()
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from controlplane.policies.admission import (
    AdmissionConfig,
    compute_policy,
    prompt_quartiles,
    slo_key,
)
from exporters.fleet import PoolRole
from exporters.slo import Objective
from serving.gateway.admission import Decision, RequestInfo
from serving.gateway.admission_load import LoadTracker
from serving.gateway.admission_policy import PolicyAdmission
from serving.gateway.routing import InstanceState
from serving.sim.cluster.policy import ClusterSnapshot
from serving.sim.cluster.simulator import slo_spec
from serving.sim.control.profile import profile_params

__all__ = ["SIM_CONFIG", "SimAdmission"]

#: The simulator always reaches its control plane: the policy's TTL never runs out.
SIM_CONFIG = AdmissionConfig(ttl_s=86_400.0)


class SimAdmission:
    """Admission control in the simulator (see the module docstring)."""

    def __init__(
        self,
        *,
        profile: str,
        objectives: Sequence[Objective],
        interval_s: float = 1.0,
        config: AdmissionConfig = SIM_CONFIG,
        infeasible: str = "admit",
    ) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s must be a finite number > 0, got {interval_s!r}")
        self.profile = profile
        self.slo = dataclasses.replace(slo_spec(objectives), infeasible=infeasible)
        self.slo_label = slo_key(self.slo)
        self.interval_s = interval_s
        self.config = config
        self._now = 0.0
        self.tracker = LoadTracker()
        self.rule = PolicyAdmission(self.tracker, clock_s=lambda: self._now)
        self._num_seen = 0
        self._prompt_sum = 0.0
        self._output_sum = 0.0
        self._prompts: list[int] = []
        self._bounds: tuple[int, ...] = ()
        self._bounds_at = 0  # requests seen when the bounds were computed
        self._burn: float | None = None
        self._version = 0
        self._refresh_policy()

    # -- SimPolicy --

    def admit(self, info: RequestInfo) -> Decision:
        self._now = info.arrival_s
        self._num_seen += 1
        self._prompt_sum += info.prompt_tokens
        self._output_sum += info.max_tokens or 0
        self._prompts.append(info.prompt_tokens)
        if not info.slo:  # the simulator's requests carry no slo label: its one SLO
            info = dataclasses.replace(info, slo=self.slo_label)
        decision = self.rule.decide(info)
        if decision.admit:  # routing queues it on the least-loaded prefill instance
            target = self.tracker.min_prefill_id
            if target is not None:
                self.tracker.add(target, prefill_tokens=info.prompt_tokens)
        return decision

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        self._now = snapshot.now_s
        self.tracker.sync(
            InstanceState(
                id=v.id,
                url=v.id,
                role=v.role,
                prefill_tokens=v.prefill_tokens,
                decode_streams=v.decode_streams,
            )
            for v in snapshot.instances
        )
        self.tracker.prefill_requests = sum(
            v.waiting + v.running for v in snapshot.instances if v.role is PoolRole.PREFILL
        )
        burns = [s.burn_rate for s in snapshot.goodput if s.burn_rate is not None]
        self._burn = max(burns) if burns else None
        self._refresh_policy()
        return {}

    # -- the policy the control plane would push --

    def _refresh_policy(self) -> None:
        n = self._num_seen
        params = profile_params(
            self.profile,
            prompt_tokens=self._prompt_sum / n if n else 1024.0,
            output_tokens=self._output_sum / n if n else 256.0,
            decode_batch=self.tracker.decode_streams / max(1, self.tracker.num_decode),
        )
        if n >= 1.25 * self._bounds_at or n >= self._bounds_at + 1_000:
            self._bounds = prompt_quartiles(self._prompts)
            self._bounds_at = n
        self._version += 1
        self.policy = compute_policy(
            params,
            [self.slo],
            {self.slo.id: self._burn},
            self.config,
            version=self._version,
            prompt_class_bounds=self._bounds if self.config.availability_floor > 0 else None,
        )
        self.rule.apply(self.policy)
