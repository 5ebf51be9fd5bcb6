"""The gateway's SLO-aware admission rule as a simulator policy (``SimPolicy``).

:class:`SimAdmission` runs the very rule the gateway runs
(:class:`serving.gateway.admission_policy.PolicyAdmission`) on the simulator's virtual
clock, with the policy the control plane would push, computed by the same pure functions
(:func:`controlplane.policies.admission.margin_ratio` and
:func:`~controlplane.policies.admission.max_batch`):

* **model** — the latency model the control plane learns online, read here from the
  cluster's profile (its fitted prefill and decode step times, the NVLink KV transfer),
  which is what the learner converges to on this simulator's records: prefill rate at the
  mean prompt length seen, ``itl = a + b·batch + c·context`` fitted over the decode step
  table, mean decode time (mean output × the ITL at the decode batch of the last snapshot)
  and context from the requests seen so far;
* **SLO** — the scenario's TTFT and ITL thresholds (``ttft_s``, ``itl_s``), keyed by the
  simulator's SLO id (its requests carry no ``slo`` label, so they get that one); its
  margin follows the SLO's burn rate over the last minute (``snapshot.goodput``), as the
  control plane's does;
* **load** — a :class:`~serving.gateway.admission_load.LoadTracker` rebuilt from each
  snapshot (every ``interval_s`` of virtual time: the instances' queued prefill tokens and
  decode streams as the simulated gateway counts them, the requests waiting or running on
  prefill instances), and moved between snapshots by the requests it admits (each one
  queues on the least-loaded prefill instance, as routing sends it there).

The simulator's requests have no priority class, so they are all of the default class
(sheddable, full headroom). ``plan`` never moves an instance: combine it with a planner
(``serving.sim.control.eval.contenders.Combined``).

Example::

    policy = SimAdmission(profile="h100-llama3.1-8b", ttft_s=0.5, itl_s=0.05)
    result = Simulator(spec, workload, SimOptions(), policy=policy).run()
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import numpy as np

from controlplane.policies.admission import AdmissionConfig, margin_ratio, max_batch
from controlplane.policies.learning import LearnedParams
from exporters.admission import AdmissionModel, AdmissionPolicy, ClassPolicy, SLOAdmission
from serving.gateway.admission import Decision, RequestInfo
from serving.gateway.admission_load import LoadTracker
from serving.gateway.admission_policy import PolicyAdmission
from serving.gateway.routing import InstanceState, PoolRole
from serving.sim.cluster.policy import ClusterSnapshot
from serving.sim.cluster.simulator import SLO_ID
from serving.sim.kv import get_link
from serving.sim.latency_model import LatencyModel

__all__ = ["SimAdmission", "profile_params"]

_GRID_BATCH = (1, 8, 32, 64, 128, 256)
_GRID_CONTEXT_PER_SEQ = (256, 1024, 4096)


@functools.cache
def _latency(profile: str) -> LatencyModel:
    return LatencyModel.for_profile(profile)


@functools.cache
def _decode_fit(profile: str) -> tuple[float, float, float]:
    """``(a, b, c)`` of ``itl = a + b·batch + c·context`` over the profile's step table."""
    latency = _latency(profile)
    rows, ys = [], []
    for batch in _GRID_BATCH:
        for per_seq in _GRID_CONTEXT_PER_SEQ:
            rows.append((1.0, float(batch), float(batch * per_seq)))
            ys.append(latency.decode_step_s(batch, batch * per_seq))
    (a, b, c), *_ = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)
    return max(float(a), 1e-4), max(float(b), 0.0), max(float(c), 0.0)


def profile_params(
    profile: str,
    *,
    prompt_tokens: float = 1024.0,
    output_tokens: float = 256.0,
    decode_batch: float = 1.0,
) -> LearnedParams:
    """The admission model of a cluster profile at these mean lengths and this decode
    batch per instance (see the module docstring): what the online learner converges to
    on that hardware."""
    latency = _latency(profile)
    prompt = max(1, round(prompt_tokens))
    rate = prompt / latency.prefill_s([prompt])
    a, b, c = _decode_fit(profile)
    link = get_link("nvlink")
    kv_bytes = prompt * latency.kv_bytes_per_token_per_gpu
    handoff = link.setup_s + kv_bytes / link.bytes_per_s
    batch = max(1.0, decode_batch)
    itl = a + b * batch + c * batch * (prompt + output_tokens / 2)
    return LearnedParams(
        prefill_tokens_per_s=rate,
        kv_handoff_s=handoff,
        itl_base_s=a,
        itl_per_stream_s=b,
        itl_per_context_token_s=c,
        mean_decode_s=max(output_tokens * itl, 1e-3),
        mean_context_tokens=prompt + output_tokens / 2,
    )


class SimAdmission:
    """Admission control in the simulator (see the module docstring)."""

    def __init__(
        self,
        *,
        profile: str,
        ttft_s: float | None,
        itl_s: float | None,
        interval_s: float = 1.0,
        config: AdmissionConfig | None = None,
        classes: Mapping[str, ClassPolicy] | None = None,
    ) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s must be a finite number > 0, got {interval_s!r}")
        self.profile = profile
        self.ttft_s = ttft_s if ttft_s is not None and ttft_s < 1e8 else None
        self.itl_s = itl_s if itl_s is not None and itl_s < 1e8 else None
        self.interval_s = interval_s
        # The simulator always reaches its control plane: the TTL never runs out.
        self.config = config or AdmissionConfig(ttl_s=86_400.0)
        self.classes = dict(classes) if classes is not None else {}
        self._now = 0.0
        self.tracker = LoadTracker()
        self.rule = PolicyAdmission(self.tracker, clock_s=lambda: self._now)
        self._num_seen = 0
        self._prompt_sum = 0.0
        self._output_sum = 0.0
        self._burn: float | None = None
        self._version = 0
        self._refresh_policy()

    # -- SimPolicy --

    def admit(self, info: RequestInfo) -> Decision:
        self._now = info.arrival_s
        self._num_seen += 1
        self._prompt_sum += info.prompt_tokens
        self._output_sum += info.max_tokens or 0
        if not info.slo:  # the simulator's requests carry no slo label: its one SLO
            info = dataclasses.replace(info, slo=SLO_ID)
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
        self._version += 1
        config = self.config
        slo = SLOAdmission(
            ttft_s=self.ttft_s,
            itl_s=self.itl_s,
            burn_rate=self._burn if self._burn is not None and math.isfinite(self._burn) else 0.0,
            margin_ratio=margin_ratio(self._burn, config),
        )
        self.policy = AdmissionPolicy(
            version=self._version,
            ttl_s=config.ttl_s,
            fallback_max_concurrency=config.fallback_max_concurrency,
            classes=self.classes,
            slos={SLO_ID: slo},
            model=AdmissionModel(
                prefill_tokens_per_s=params.prefill_tokens_per_s,
                kv_handoff_s=params.kv_handoff_s,
                itl_base_s=params.itl_base_s,
                itl_per_stream_s=params.itl_per_stream_s,
                itl_per_context_token_s=params.itl_per_context_token_s,
                max_decode_batch=max_batch(params, self.itl_s, config),
                mean_decode_s=params.mean_decode_s,
                mean_context_tokens=params.mean_context_tokens,
            ),
        )
        self.rule.apply(self.policy)
