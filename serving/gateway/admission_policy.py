"""SLO-aware admission: the gateway's per-request rule over the policy the control plane pushes.

:class:`PolicyAdmission` is an :class:`~serving.gateway.admission.AdmissionHook`. It holds
the last :class:`~exporters.admission.AdmissionPolicy` applied (``apply``), a
:class:`~serving.gateway.admission_load.LoadTracker` (the gateway's in-flight work as
running sums) and an injected clock; :meth:`decide` is a pure function of those and the
request, O(1), with no I/O.

Modes (``mode()``, exported as ``goodput_gateway_admission_mode{mode}``):

* ``allow_all`` — no policy yet: everything is admitted;
* ``policy`` — a policy younger than its ``ttl_s``: the prediction below;
* ``fallback`` — the policy is older than ``ttl_s`` (the control plane is gone): a plain
  concurrency cap of ``fallback_max_concurrency`` × ``share_ratio`` requests in flight.
  Classes the last policy marks not sheddable are still never refused.

The prediction, for a request of priority class ``c``, SLO ``s`` and ``p`` prompt tokens:

0. **infeasible requests** first: its TTFT on an idle instance, ``p`` ÷ the fastest prefill
   rate (no queue; the learned KV handoff is left out: it is measured from records under
   load, the decode leg's queueing in it, so it is no idle figure, and a lower bound keeps
   the error on the side of calling a request feasible), against the SLO's TTFT objective
   itself (no margin, no headroom: those make room under load, and an idle instance has
   none to make). Above
   it the request can never meet the objective, whatever the load: where the SLO's
   ``infeasible`` is ``"reject"`` it is refused at once (``400``, type
   ``infeasible_request``, no ``Retry-After``: retrying cannot help). Where it is
   ``"admit"`` (the default) it is served as best effort where it takes no room from the
   feasible requests — the least-loaded prefill instance is idle and another one stays
   idle (at most ``num_prefill − 2`` requests in prefill) — and deferred otherwise
   (``429``, its idle TTFT as ``Retry-After``). A never-shed class is always admitted.
   Either way it is counted apart
   (``goodput_gateway_admission_infeasible_total{slo,action}``), never as a rejection for
   load, and it takes no part in the availability floor or the room kept for never-shed
   traffic;

1. TTFT = (queued prompt tokens on the least-loaded prefill instance + ``p``) ÷ that
   instance's prefill rate + the KV handoff time; where the engines serve by priority
   (``RequestInfo.engine_priority``, the gateway's ``--engine-priority``), only the tokens
   queued at the request's engine priority or a lower number count (served first);
2. the decode load when its prefill finishes, ``Δ`` = that TTFT from now (Mooncake's
   lesson: judging by the *current* decode load makes prefill and decode swing in opposite
   phase): streams running now that are still running then, ``n·exp(−Δ/mean_decode_s)``
   (remaining decode times taken as memoryless), plus every request in prefill now (they
   reach decode first), plus this one, spread over the decode instances → batch ``b``;
   ITL = ``itl_base_s + itl_per_stream_s·b + itl_per_context_token_s·b·mean_context``;
3. the allowed latency is the SLO's objective (the class's ``ttft_s`` when the SLO has no
   TTFT objective) × the SLO's burn-rate ``margin_ratio`` × the class's ``headroom_ratio``
   × ``over_share_ratio`` when the tenant holds more than its fair share of the requests
   in flight. Lower classes have less headroom, so they are refused first and the room
   they leave serves the higher ones; a non-sheddable class is never refused. **Room for
   the never-shed traffic**: the allowed TTFT is then lessened by the prefill time of the
   never-shed prompt tokens expected within one TTFT objective (their arrival rate, prompt
   tokens per second over the last ``RESERVE_WINDOW_S`` (:class:`TokenRate`), × the
   objective, spread over the prefill instances, ÷ the prefill rate). A never-shed request
   queues behind what the sheddable classes left in the queue; without this room they
   would fill it up to the objective and every never-shed request arriving then would
   miss it (measured on vLLM: docs/admission.md, "Live on vLLM"). Without never-shed
   traffic the room is 0. Where the engines serve by priority the room is for the tokens
   admitted at lower engine numbers (they pass the request) and the never-shed arrivals
   at its own number (they queue behind it): :meth:`PolicyAdmission._reserve_s`;
4. a prediction above its allowed value (or a decode batch above ``max_decode_batch`` ×
   the same factors) rejects the request: ``429``, ``Retry-After``, a body naming the SLO,
   the objective, the predicted and the allowed latency;
5. **the availability floor** — unless its prompt-length class (the policy's
   ``prompt_class_bounds``) is being starved: the rule keeps, per class, the requests
   offered and admitted over the last minute (counts decayed by ``exp(−age / 60 s)``), and
   a request the prediction refuses is admitted anyway while its class's availability is
   below ``availability_floor`` × the availability of all classes together. Long prompts
   are the first a latency prediction refuses (their own prefill is part of their TTFT),
   so without it a long-prompt class can be shed almost entirely while the short ones are
   all served; with it, a starved class gets admitted requests back and the load they add
   makes the prediction refuse more of the other classes. The floor turns refusals into
   admissions, never the reverse (:class:`ClassAvailability`, ``num_floor_admitted``).

**Several gateways** in front of the same instances (the policy's ``share_ratio`` < 1):
each sees only the requests it sent, so it owns ``share_ratio`` of the fleet's capacity
and reads the fleet's load as its own ÷ ``share_ratio``: the queued prompt tokens of step 1
(not the request's own prompt), the streams and requests in prefill of step 2, the
never-shed arrival rate of step 3, the requests in prefill of step 0's best effort; and
its fallback cap is its share of ``fallback_max_concurrency``
(:meth:`~exporters.admission.AdmissionPolicy.fallback_cap`). With shares that sum to 1 the
gateways together admit what one gateway would (docs/scale-out.md). Every request offered
counts in ``num_offered``; :meth:`PolicyAdmission.offered_rps` turns it into requests per
second since its previous call, which the gateway reports in its heartbeats so the control
plane can weigh the shares.

Every admitted request counts in flight (per tenant, for fairness, and in all, for the
fallback cap) until its record is finished (:meth:`on_finished`, fed by the gateway's
record sink through :class:`AdmissionFeedback`).

Predicted against observed: while a policy with a model is in force, every admitted request
gets the TTFT prediction of step 1 (whether or not its SLO has a TTFT objective), kept by
request id (at most :data:`MAX_PREDICTIONS`; the oldest go first, counted in
``num_predictions_dropped``). When its record finishes ``OK`` with a first token
(:meth:`on_measured`), the histogram ``goodput_gateway_admission_ttft_seconds{priority,
kind}`` gets the prediction (``kind="predicted"``) and the TTFT the gateway measured
(``kind="observed"``): the same requests on both sides. A request that fails, is aborted or
has no token leaves its prediction out. The prediction covers the prefill queue, the
prefill and the KV hand-off; the measured TTFT also holds the gateway's own time.

Example::

    rule = PolicyAdmission(tracker, clock_s=time.monotonic, registry=registry)
    rule.apply(policy)                   # from a set_admission_policy command
    decision = rule.decide(info)         # per request
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters.admission import (
    AdmissionModel,
    AdmissionPolicy,
    ClassPolicy,
    SLOAdmission,
    prompt_class,
)
from exporters.buckets import LATENCY_BUCKETS_S
from exporters.records import RequestRecord, Status
from serving.gateway.admission import ADMIT, Decision, RequestInfo
from serving.gateway.admission_load import LoadTracker

__all__ = [
    "AVAILABILITY_WINDOW_S",
    "MAX_PREDICTIONS",
    "MIN_OFFERED_SPAN_S",
    "MODES",
    "RESERVE_WINDOW_S",
    "AdmissionFeedback",
    "ClassAvailability",
    "PolicyAdmission",
    "TokenRate",
    "below_floor",
]

MODES = ("allow_all", "policy", "fallback")
#: TTFT predictions kept for admitted requests until their record comes (oldest dropped).
MAX_PREDICTIONS = 65_536
_MAX_RETRY_AFTER_S = 60.0
#: The time constant of the per-class availability counts the floor judges by.
AVAILABILITY_WINDOW_S = 60.0
#: The time constant of the never-shed classes' arrival rate (the room kept for them).
RESERVE_WINDOW_S = 10.0
#: The offered request rate (its share's weight) is measured over at least this long.
MIN_OFFERED_SPAN_S = 1.0


class TokenRate:
    """Tokens per second arriving, over an exponentially decaying window.

    ``add(tokens, now_s)`` counts an arrival; ``rate(now_s)`` is the decayed token count
    ÷ the decayed time observed, ``window_s·(1 − exp(−T/window_s))`` for ``T`` seconds
    since the first arrival (at least ``window_s / 10``, so one arrival is not an infinite
    rate): a steady stream of ``λ`` tokens/s reads ``λ`` from the start, not only after a
    window (tested). Non-negative; it decays toward 0 once arrivals stop. O(1).
    """

    __slots__ = ("_at_s", "_start_s", "_sum", "window_s")

    def __init__(self, window_s: float = RESERVE_WINDOW_S) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be a finite number > 0, got {window_s!r}")
        self.window_s = window_s
        self._sum = 0.0
        self._at_s: float | None = None  # when _sum was last decayed
        self._start_s = 0.0  # the first arrival

    def add(self, tokens: float, now_s: float) -> None:
        if self._at_s is None:
            self._at_s = self._start_s = now_s
        elif now_s > self._at_s:
            self._sum *= math.exp(-(now_s - self._at_s) / self.window_s)
            self._at_s = now_s
        self._sum += max(0.0, tokens)

    def rate(self, now_s: float) -> float:
        """Tokens per second (0 before any arrival)."""
        at = self._at_s
        if at is None:
            return 0.0
        now_s = max(now_s, at)
        window = self.window_s
        decayed = self._sum * math.exp(-(now_s - at) / window)
        span = window * -math.expm1(-(now_s - self._start_s) / window)
        return decayed / max(span, window / 10.0)


class ClassAvailability:
    """Requests offered and admitted per class, decayed by ``exp(−age / window_s)``.

    ``offer(cls, now_s)`` counts an arrival (decaying every count to ``now_s`` first),
    ``admit(cls)`` its admission; :meth:`starved` says whether a class's availability is
    below ``floor`` × the availability of all classes together. O(classes) per call.
    Invariant (tested): a class whose every refusal is overturned while it is starved keeps
    ``admitted ≥ floor·r·offered − 1`` for a fixed overall availability ``r``; decay scales
    both sides, so it holds in any window.
    """

    def __init__(self, window_s: float = AVAILABILITY_WINDOW_S) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be a finite number > 0, got {window_s!r}")
        self.window_s = window_s
        self.offered: dict[int, float] = {}
        self.admitted: dict[int, float] = {}
        self._at_s: float | None = None

    def offer(self, cls: int, now_s: float) -> None:
        if self._at_s is not None and now_s > self._at_s:
            decay = math.exp(-(now_s - self._at_s) / self.window_s)
            for key in self.offered:
                self.offered[key] *= decay
                self.admitted[key] *= decay
        if self._at_s is None or now_s > self._at_s:
            self._at_s = now_s
        self.offered[cls] = self.offered.get(cls, 0.0) + 1.0
        self.admitted.setdefault(cls, 0.0)

    def admit(self, cls: int) -> None:
        self.admitted[cls] = self.admitted.get(cls, 0.0) + 1.0

    def ratio(self, cls: int) -> float:
        """Admitted ÷ offered of ``cls`` (1 before anything was offered)."""
        offered = self.offered.get(cls, 0.0)
        return self.admitted.get(cls, 0.0) / offered if offered > 0 else 1.0

    def overall(self) -> float:
        """Admitted ÷ offered over every class (1 before anything was offered)."""
        offered = sum(self.offered.values())
        return sum(self.admitted.values()) / offered if offered > 0 else 1.0

    def starved(self, cls: int, floor: float) -> bool:
        """Whether ``cls``'s availability is below ``floor`` × the overall availability."""
        if floor <= 0:
            return False
        return below_floor(
            self.admitted.get(cls, 0.0), self.offered.get(cls, 0.0), floor * self.overall()
        )

    def starved_classes(self, floor: float) -> set[int]:
        """Every class :meth:`starved` names (the overall availability read once)."""
        if floor <= 0:
            return set()
        ratio = floor * self.overall()
        return {c for c, n in self.offered.items() if below_floor(self.admitted[c], n, ratio)}


def below_floor(admitted: float, offered: float, floor_ratio: float) -> bool:
    """Whether ``admitted ÷ offered`` is below ``floor_ratio`` (never, with nothing
    offered)."""
    return offered > 0 and admitted < floor_ratio * offered


class PolicyAdmission:
    """The SLO-aware admission rule (see the module docstring).

    ``tracker``: the gateway's load view. ``clock_s``: a monotonic clock in seconds (the
    simulator passes its virtual clock). ``registry``: where the admission metrics go
    (none without it).
    """

    def __init__(
        self,
        tracker: LoadTracker,
        *,
        clock_s: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.tracker = tracker
        self.clock_s = clock_s
        self.policy: AdmissionPolicy | None = None
        self.applied_s = 0.0
        self.in_flight = 0
        self._tenants: dict[str, int] = {}  # tenant → requests in flight
        self._weight_sum = 0.0  # Σ weights of tenants with requests in flight
        self.num_rejected = 0
        self.num_floor_admitted = 0  # refusals the availability floor overturned
        self.availability = ClassAvailability()
        self.never_shed = TokenRate()  # prompt tokens/s of the classes never shed
        # Where the engines serve by priority (RequestInfo.engine_priority is not None), by
        # the engine priority requests are sent with: the prompt tokens/s admitted, and
        # those of the never-shed classes' arrivals.
        self.admitted_by_priority: dict[int, TokenRate] = {}
        self.never_shed_by_priority: dict[int, TokenRate] = {}
        self.num_offered = 0  # requests offered to this gateway (admitted or not)
        self._offered_at = (0, clock_s(), 0.0)  # (num_offered, when, rate) at the last read
        self._inv_share = 1.0  # 1 / the policy's share_ratio (the fleet's load ÷ this one's)
        self._fallback_cap = 0  # the policy's fallback cap for this gateway
        self.num_infeasible = {
            "admit": 0,
            "defer": 0,
            "reject": 0,
        }  # infeasible requests, by action
        self._fastest_rate = 0.0  # the policy model's fastest prefill rate (0: no model)
        self._infeasible_total: Counter | None = None
        self._infeasible_children: dict[tuple[str, str], object] = {}
        self._rejections: Counter | None = None
        self._rejection_children: dict[tuple[str, str], object] = {}
        self._ttft: Histogram | None = None
        self._predicted: dict[str, tuple[str, float]] = {}  # request id → (class, TTFT s)
        self.num_predictions_dropped = 0
        if registry is not None:
            self._ttft = Histogram(
                "goodput_gateway_admission_ttft_seconds",
                "TTFT admission predicted for admitted requests (kind=predicted) and the TTFT "
                "the gateway measured for the same requests (kind=observed), by priority "
                "class (other: not in the policy).",
                ("priority", "kind"),
                buckets=LATENCY_BUCKETS_S,
                registry=registry,
            )
            self._rejections = Counter(
                "goodput_gateway_admission_rejections",
                "Requests refused by admission, by priority class (other: not in the policy) "
                "and reason (ttft, itl, batch, fallback).",
                ("priority", "reason"),
                registry=registry,
            )
            self._infeasible_total = Counter(
                "goodput_gateway_admission_infeasible",
                "Requests predicted to miss their SLO's TTFT objective even on an idle "
                "instance, by SLO (other: not in the policy) and action (admit: served as "
                "best effort; defer: refused with 429 while no prefill instance is spare; "
                "reject: refused at once with 400). Not load shedding.",
                ("slo", "action"),
                registry=registry,
            )
            registry.register(_ModeCollector(self))

    # -- the policy ---------------------------------------------------------------------

    def apply(self, policy: AdmissionPolicy) -> str:
        """Take ``policy`` from now on (its TTL starts now). Returns a detail for the ack.
        Raises ``ValueError`` for a version older than the one applied (a late duplicate
        must not undo a newer decision)."""
        current = self.policy
        if current is not None and policy.version < current.version:
            raise ValueError(
                f"stale: policy version {policy.version} < applied version {current.version}"
            )
        self.policy = policy
        self.applied_s = self.clock_s()
        model = policy.model
        self._fastest_rate = 0.0 if model is None else model.fastest_prefill_rate()
        self._inv_share = 1.0 / policy.share_ratio
        self._fallback_cap = policy.fallback_cap()
        self._weight_sum = sum(self._weight(t) for t, n in self._tenants.items() if n > 0)
        return f"admission policy version {policy.version} applied (ttl {policy.ttl_s:g} s)"

    def mode(self) -> str:
        policy = self.policy
        if policy is None:
            return "allow_all"
        return "policy" if self.clock_s() - self.applied_s <= policy.ttl_s else "fallback"

    def offered_rps(self) -> float:
        """Requests per second offered to this gateway (admitted or not) since the previous
        call (at least :data:`MIN_OFFERED_SPAN_S` ago, else the previous answer): what its
        heartbeat reports, the weight of its share. Counting costs ``decide`` one
        increment; the division happens here, once per heartbeat."""
        count, at_s, rate = self._offered_at
        now_s = self.clock_s()
        if now_s - at_s >= MIN_OFFERED_SPAN_S:
            rate = (self.num_offered - count) / (now_s - at_s)
            self._offered_at = (self.num_offered, now_s, rate)
        return rate

    def _weight(self, tenant: str) -> float:
        policy = self.policy
        return 1.0 if policy is None else policy.tenant_weights.get(tenant, 1.0)

    # -- per request --------------------------------------------------------------------

    def decide(self, info: RequestInfo) -> Decision:
        """Admit or reject ``info`` (see the module docstring). Admitted requests count in
        flight until :meth:`on_finished` sees their record. One clock read and one TTFT
        prediction per request."""
        policy = self.policy
        cls = -1
        self.num_offered += 1
        if policy is not None:
            now_s = self.clock_s()
            in_force = now_s - self.applied_s <= policy.ttl_s
            model = policy.model if in_force else None
            rules = policy.classes.get(info.priority)
            if model is not None and self._fastest_rate > 0:
                idle_s = info.prompt_tokens / self._fastest_rate  # a lower bound: step 0
                slo = policy.slos.get(info.slo)
                objective_s = slo.ttft_s if slo is not None else None
                if objective_s is None:
                    objective_s = (rules or _DEFAULT_CLASS).ttft_s
                if objective_s is not None and idle_s > objective_s:
                    return self._infeasible(
                        policy,
                        model,
                        info,
                        rules,
                        slo,
                        idle_s=idle_s,
                        objective_s=objective_s,
                        now_s=now_s,
                    )
            if policy.prompt_class_bounds and policy.availability_floor > 0:
                cls = prompt_class(policy.prompt_class_bounds, info.prompt_tokens)
                self.availability.offer(cls, now_s)
            if rules is not None and not rules.sheddable:
                self.never_shed.add(info.prompt_tokens, now_s)
                if info.engine_priority is not None:
                    _rate(self.never_shed_by_priority, info.engine_priority).add(
                        info.prompt_tokens, now_s
                    )
            ttft_s = None if model is None else self._ttft_s(model, info)
            decision = self._judge(policy, info, now_s, ttft_s, cls)
            if not decision.admit:
                if (
                    cls < 0
                    or decision.objective == "concurrency"
                    or not self.availability.starved(cls, policy.availability_floor)
                ):
                    self._rejected(policy, info.priority, decision.objective)
                    return decision
                self.num_floor_admitted += 1
            if ttft_s is not None and self._ttft is not None:
                self._keep_prediction(policy, info, ttft_s)
            self._by_priority(info, now_s)
        if cls >= 0:
            self.availability.admit(cls)
        self._admitted(info)
        return ADMIT

    def _infeasible(
        self,
        policy: AdmissionPolicy,
        model: AdmissionModel,
        info: RequestInfo,
        rules: ClassPolicy | None,
        slo: SLOAdmission | None,
        *,
        idle_s: float,
        objective_s: float,
        now_s: float,
    ) -> Decision:
        """Step 0 of the module docstring: a request predicted to miss the TTFT objective
        on an idle instance. Rejected at once (``400``, no ``Retry-After``) where its SLO
        says ``reject`` and its class may be shed. Where it says ``admit``, served as best
        effort only where it takes no room from the feasible requests (:meth:`_spare`):
        otherwise deferred (``429`` with its idle TTFT as ``Retry-After``). A never-shed
        class is always admitted. Each counted in ``num_infeasible`` and
        ``goodput_gateway_admission_infeasible_total{slo,action}`` (``admit``, ``defer``,
        ``reject``), never as a rejection for load, and left out of the availability
        floor's counts and of the room kept for never-shed traffic (no room can make it
        meet the objective)."""
        never_shed = rules is not None and not rules.sheddable
        reject = slo is not None and slo.infeasible == "reject" and not never_shed
        if reject:
            action = "reject"
        elif never_shed or self._spare():
            action = "admit"
        else:
            action = "defer"
        self.num_infeasible[action] += 1
        if self._infeasible_total is not None:
            key = (info.slo if slo is not None else "other", action)
            child = self._infeasible_children.get(key)
            if child is None:
                child = self._infeasible_children[key] = self._infeasible_total.labels(*key)
            child.inc()  # type: ignore[attr-defined]
        if action == "defer":
            return Decision(
                False,
                f"slo {info.slo!r}: infeasible request: predicted TTFT on an idle instance "
                f"{idle_s:.3f} s > objective {objective_s:g} s; served as best effort only "
                f"while {min(2, self.tracker.num_prefill)} of the {self.tracker.num_prefill} "
                f"prefill instances are idle, and {self.tracker.prefill_requests} requests are "
                f"in prefill (policy v{policy.version})",
                _retry_after(idle_s),
                info.slo,
                "ttft",
                idle_s,
                objective_s,
                infeasible=True,
            )
        if reject:
            return Decision(
                False,
                f"slo {info.slo!r}: infeasible request: predicted TTFT on an idle instance "
                f"{idle_s:.3f} s > objective {objective_s:g} s ({info.prompt_tokens} prompt "
                f"tokens at {self._fastest_rate:.0f} tokens/s; policy v{policy.version}); the "
                "SLO rejects requests it can never serve in time, so retrying will not help: "
                "shorten the prompt",
                None,
                info.slo,
                "ttft",
                idle_s,
                objective_s,
                status_code=400,
                error_type="infeasible_request",
                infeasible=True,
            )
        if self._ttft is not None:
            self._keep_prediction(policy, info, self._ttft_s(model, info))
        self._by_priority(info, now_s)
        self._admitted(info)
        return ADMIT

    def _spare(self) -> bool:
        """Whether an infeasible request can be served as best effort without taking room
        from feasible ones: the least-loaded prefill instance is idle and, with two or
        more prefill instances, another one stays idle (at most ``num_prefill − 2``
        requests in prefill now)."""
        load = self.tracker
        return load.min_prefill_tokens == 0 and load.prefill_requests * self._inv_share <= max(
            0, load.num_prefill - 2
        )

    def _keep_prediction(self, policy: AdmissionPolicy, info: RequestInfo, ttft_s: float) -> None:
        """Keep an admitted request's TTFT prediction until its record comes."""
        predicted = self._predicted
        if len(predicted) >= MAX_PREDICTIONS:
            del predicted[next(iter(predicted))]
            self.num_predictions_dropped += 1
        label = info.priority if info.priority in policy.classes else "other"
        predicted[info.request_id] = (label, ttft_s)

    def _ttft_s(self, model: AdmissionModel, info: RequestInfo) -> float:
        """Step 1 of the module docstring: the predicted TTFT of ``info`` (the queue is the
        fleet's as this gateway reads it: its own ÷ its share)."""
        load = self.tracker
        rate = model.prefill_rate(load.min_prefill_id)
        queued = load.tokens_ahead(info.engine_priority) * self._inv_share
        return (queued + info.prompt_tokens) / rate + model.kv_handoff_s

    def _judge(
        self,
        policy: AdmissionPolicy,
        info: RequestInfo,
        now_s: float,
        ttft_s: float | None,
        prompt_cls: int,
    ) -> Decision:
        """Steps 1-4 of the module docstring; ``ttft_s`` is step 1's prediction (``None``
        without a model in force)."""
        cls = policy.classes.get(info.priority)
        if cls is not None and not cls.sheddable:
            return ADMIT
        age_s = now_s - self.applied_s
        if age_s > policy.ttl_s:
            cap = self._fallback_cap
            if self.in_flight < cap:
                return ADMIT
            return Decision(
                False,
                f"admission policy v{policy.version} expired {age_s - policy.ttl_s:.0f} s ago "
                f"(ttl {policy.ttl_s:g} s): fallback concurrency cap reached, predicted "
                f"{self.in_flight + 1} requests in flight > allowed {cap}",
                1.0,
                info.slo,
                "concurrency",
                float(self.in_flight + 1),
                float(cap),
            )
        model = policy.model
        if model is None or ttft_s is None:
            return ADMIT
        if cls is None:
            cls = _DEFAULT_CLASS
        slo = policy.slos.get(info.slo)
        if slo is None:
            ttft_objective, itl_objective, margin = cls.ttft_s, None, 1.0
        else:
            ttft_objective = slo.ttft_s if slo.ttft_s is not None else cls.ttft_s
            itl_objective, margin = slo.itl_s, slo.margin_ratio
        if ttft_objective is None and itl_objective is None:
            return ADMIT
        factor = margin * cls.headroom_ratio
        if self._over_share(info.tenant) or self._crowds_out(policy, prompt_cls):
            factor *= policy.over_share_ratio
        load = self.tracker
        if ttft_objective is not None:
            reserve_s = self._reserve_s(model, ttft_objective, now_s, info.engine_priority)
            allowed = max(0.0, ttft_objective * factor - reserve_s)
            if ttft_s > allowed:
                return self._reject(
                    info,
                    policy,
                    objective="ttft",
                    predicted_s=ttft_s,
                    allowed_s=allowed,
                    objective_s=ttft_objective,
                    factor=factor,
                    wait_s=ttft_s - allowed,
                    reserve_s=reserve_s,
                    by_priority=info.engine_priority is not None,
                )
        num_decode = load.num_decode or 1
        running_then = load.decode_streams * math.exp(-ttft_s / model.mean_decode_s)
        batch = (running_then + load.prefill_requests) * self._inv_share / num_decode + 1.0
        if batch > model.max_decode_batch * factor:
            wait_s = model.mean_decode_s * (1.0 - model.max_decode_batch * factor / batch)
            return Decision(
                False,
                f"slo {info.slo!r}: predicted decode batch {batch:.1f} when its prefill ends "
                f"> allowed {model.max_decode_batch * factor:.1f} (max {model.max_decode_batch} "
                f"for the ITL target x {factor:.2f}; priority {info.priority!r}, policy "
                f"v{policy.version})",
                _retry_after(wait_s),
                info.slo,
                "batch",
                batch,
                model.max_decode_batch * factor,
            )
        if itl_objective is not None:
            itl_s = model.itl_s(batch, batch * model.mean_context_tokens)
            allowed = itl_objective * factor
            if itl_s > allowed:
                excess = 1.0 - allowed / itl_s
                return self._reject(
                    info,
                    policy,
                    objective="itl",
                    predicted_s=itl_s,
                    allowed_s=allowed,
                    objective_s=itl_objective,
                    factor=factor,
                    wait_s=model.mean_decode_s * excess,
                )
        return ADMIT

    def _reserve_s(
        self,
        model: AdmissionModel,
        ttft_objective_s: float,
        now_s: float,
        engine_priority: int | None = None,
    ) -> float:
        """The room kept for the traffic that must not wait for what this request leaves
        in the prefill queue, or that will pass it there (step 3 of the module docstring):
        the prefill time of its prompt tokens expected within one TTFT objective, spread
        over the prefill instances. In arrival order (``engine_priority`` ``None``): the
        never-shed classes' arrivals, which queue behind it. By engine priority: the tokens
        admitted at a lower number (they pass it) and the never-shed arrivals at its own
        (they queue behind it); those at a higher number neither wait for it nor pass it."""
        if engine_priority is None:
            tokens_per_s = self.never_shed.rate(now_s)
        else:
            tokens_per_s = sum(
                r.rate(now_s) for p, r in self.admitted_by_priority.items() if p < engine_priority
            )
            same = self.never_shed_by_priority.get(engine_priority)
            if same is not None:
                tokens_per_s += same.rate(now_s)
        tokens = tokens_per_s * self._inv_share * ttft_objective_s
        if tokens <= 0:
            return 0.0
        load = self.tracker
        return tokens / max(1, load.num_prefill) / model.prefill_rate(load.min_prefill_id)

    def _reject(
        self,
        info: RequestInfo,
        policy: AdmissionPolicy,
        *,
        objective: str,
        predicted_s: float,
        allowed_s: float,
        objective_s: float,
        factor: float,
        wait_s: float,
        reserve_s: float = 0.0,
        by_priority: bool = False,
    ) -> Decision:
        name = "TTFT" if objective == "ttft" else "ITL"
        kept = "never-shed and higher-priority" if by_priority else "never-shed"
        room = f" - {reserve_s:.3f} s kept for {kept} traffic" if reserve_s > 0 else ""
        if policy.share_ratio < 1.0:
            room += f"; this gateway's share {policy.share_ratio:.3g} of the fleet"
        return Decision(
            False,
            f"slo {info.slo!r}: predicted {name} {predicted_s:.3f} s > allowed "
            f"{allowed_s:.3f} s ({objective_s:g} s objective x {factor:.2f} margin{room}; "
            f"priority {info.priority!r}, tenant {info.tenant!r}, policy v{policy.version})",
            _retry_after(wait_s),
            info.slo,
            objective,
            predicted_s,
            allowed_s,
        )

    def _crowds_out(self, policy: AdmissionPolicy, prompt_cls: int) -> bool:
        """Whether another prompt class is starved while ``prompt_cls`` is not: its allowed
        latency then shrinks by ``over_share_ratio``, which leaves the starved class room."""
        if prompt_cls < 0:
            return False
        avail = self.availability
        starved = avail.starved_classes(policy.availability_floor)
        return bool(starved) and prompt_cls not in starved

    def _over_share(self, tenant: str) -> bool:
        """Whether one more request would put ``tenant`` above its fair share of the
        requests in flight."""
        mine = self._tenants.get(tenant, 0)
        weight = self._weight(tenant)
        weights = self._weight_sum + (weight if mine == 0 else 0.0)
        return (mine + 1) * weights > weight * (self.in_flight + 1) * (1.0 + 1e-9)

    def _by_priority(self, info: RequestInfo, now_s: float) -> None:
        """Count an admitted request's prompt tokens at its engine priority (where the
        engines serve by priority): the traffic that passes the higher numbers."""
        if info.engine_priority is not None:
            _rate(self.admitted_by_priority, info.engine_priority).add(info.prompt_tokens, now_s)

    def _admitted(self, info: RequestInfo) -> None:
        tenant = info.tenant
        self.in_flight += 1
        mine = self._tenants.get(tenant, 0)
        if mine == 0:
            self._weight_sum += self._weight(tenant)
        self._tenants[tenant] = mine + 1

    def _rejected(self, policy: AdmissionPolicy, priority: str, reason: str) -> None:
        self.num_rejected += 1
        if self._rejections is None:
            return
        label = priority if priority in policy.classes else "other"
        key = (label, "fallback" if reason == "concurrency" else reason)
        child = self._rejection_children.get(key)
        if child is None:
            child = self._rejection_children[key] = self._rejections.labels(*key)
        child.inc()  # type: ignore[attr-defined]

    def on_measured(self, record: RequestRecord) -> None:
        """A finished record: its request's prediction, if any, against its measured TTFT."""
        found = self._predicted.pop(record.request_id, None)
        if found is None or self._ttft is None:
            return
        if record.status != Status.OK or record.emission_offsets_us.shape[0] == 0:
            return
        label, predicted_s = found
        self._ttft.labels(label, "predicted").observe(predicted_s)
        self._ttft.labels(label, "observed").observe(float(record.emission_offsets_us[0]) / 1e6)

    def on_finished(self, tenant: str) -> None:
        """A request this rule admitted has finished (any status but ``REJECTED``)."""
        mine = self._tenants.get(tenant, 0)
        if mine <= 0:
            return  # admitted before this rule was in place
        self.in_flight = max(0, self.in_flight - 1)
        if mine == 1:
            del self._tenants[tenant]
            self._weight_sum = max(0.0, self._weight_sum - self._weight(tenant))
        else:
            self._tenants[tenant] = mine - 1


_DEFAULT_CLASS = ClassPolicy()


def _rate(rates: dict[int, TokenRate], engine_priority: int) -> TokenRate:
    rate = rates.get(engine_priority)
    if rate is None:
        rate = rates[engine_priority] = TokenRate()
    return rate


def _retry_after(wait_s: float) -> float:
    return min(_MAX_RETRY_AFTER_S, max(1.0, wait_s))


class AdmissionFeedback:
    """A record sink that tells the gateway's admission hook which requests finished (the
    hook's ``on_finished(tenant)`` and ``on_measured(record)``, when it has them). Cheap,
    never raises."""

    def __init__(self, hook: Callable[[], object]) -> None:
        self._hook = hook

    def export(self, record: RequestRecord) -> None:
        if not record.final or record.status == Status.REJECTED:
            return
        hook = self._hook()
        finished = getattr(hook, "on_finished", None)
        if finished is not None:
            finished(record.labels.tenant)
        measured = getattr(hook, "on_measured", None)
        if measured is not None:
            measured(record)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        del timeout_s
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        del timeout_s


class _ModeCollector(Collector):
    """``goodput_gateway_admission_mode{mode}`` (1 for the current mode) and
    ``goodput_gateway_admission_policy_version``, computed at scrape time."""

    def __init__(self, rule: PolicyAdmission) -> None:
        self._rule = rule

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        rule = self._rule
        mode = rule.mode()
        family = GaugeMetricFamily(
            "goodput_gateway_admission_mode",
            "Admission mode: allow_all (no policy yet), policy (a policy within its TTL), "
            "fallback (the policy expired: a static concurrency cap). 1 for the current one.",
            labels=["mode"],
        )
        for name in MODES:
            family.add_metric([name], 1.0 if name == mode else 0.0)
        yield family
        yield GaugeMetricFamily(
            "goodput_gateway_admission_policy_version",
            "Version of the admission policy applied (-1: none yet).",
            value=-1 if rule.policy is None else rule.policy.version,
        )
        yield GaugeMetricFamily(
            "goodput_gateway_admission_in_flight_requests",
            "Requests admitted and not finished, as admission counts them.",
            value=rule.in_flight,
        )
        yield GaugeMetricFamily(
            "goodput_gateway_admission_share_ratio",
            "This gateway's share of the fleet's capacity in the admission policy applied "
            "(1: the only gateway, or no policy yet).",
            value=1.0 if rule.policy is None else rule.policy.share_ratio,
        )
