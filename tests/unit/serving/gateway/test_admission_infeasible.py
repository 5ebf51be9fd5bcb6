"""Requests that can never meet their SLO's TTFT objective, even on an idle instance.

The rule predicts each request's idle TTFT (its own prefill at the fastest rate, no queue;
the learned KV hand-off, measured under load, is left out) and, above the SLO's TTFT
objective, calls it infeasible: refused at once (400, no Retry-After) where the SLO says
``reject``, served as best effort where it says ``admit`` while it takes no room from the
others (deferred otherwise), always admitted for a never-shed class, counted apart and
never as a rejection for load.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from exporters._wire_fields import CommandError
from exporters.admission import AdmissionModel, AdmissionPolicy, ClassPolicy, SLOAdmission
from exporters.fleet import PoolRole
from serving.gateway.admission import RequestInfo
from serving.gateway.admission_load import LoadTracker
from serving.gateway.admission_policy import PolicyAdmission
from serving.gateway.routing import InstanceState

P1, P2, D1 = "http://p1", "http://p2", "http://d1"
RATE, HANDOFF_S, TTFT_S = 10_000.0, 0.01, 1.0
#: The longest prompt that can meet the objective on an idle instance.
LIMIT = int(TTFT_S * RATE)
MODEL = AdmissionModel(
    prefill_tokens_per_s=RATE,
    kv_handoff_s=HANDOFF_S,
    itl_base_s=0.01,
    itl_per_stream_s=0.001,
    max_decode_batch=64,
    mean_decode_s=2.0,
    mean_context_tokens=1000.0,
)
CLASSES = {
    "critical": ClassPolicy(shed_order=2, sheddable=False),
    "standard": ClassPolicy(shed_order=1),
    "sheddable": ClassPolicy(shed_order=0, headroom_ratio=0.6),
}


def policy(action: str = "admit", *, margin: float = 1.0, **kw: object) -> AdmissionPolicy:
    slo = SLOAdmission(ttft_s=TTFT_S, itl_s=0.05, margin_ratio=margin, infeasible=action)
    args: dict[str, object] = {
        "version": 3,
        "ttl_s": 30.0,
        "fallback_max_concurrency": 8,
        "classes": CLASSES,
        "slos": {"chat": slo},
        "model": MODEL,
    }
    args.update(kw)
    return AdmissionPolicy(**args)  # type: ignore[arg-type]


def info(prompt: int, priority: str = "standard", slo: str = "chat") -> RequestInfo:
    return RequestInfo("r", "m", "t", slo, priority, prompt, 100, True, 0.0)


def rule(p: AdmissionPolicy, queued: int = 0) -> tuple[PolicyAdmission, CollectorRegistry]:
    t = LoadTracker()
    t.sync(
        [
            InstanceState(P1, P1, PoolRole.PREFILL, prefill_tokens=queued),
            InstanceState(P2, P2, PoolRole.PREFILL, prefill_tokens=queued),
            InstanceState(D1, D1, PoolRole.DECODE),
        ]
    )
    registry = CollectorRegistry()
    r = PolicyAdmission(t, clock_s=lambda: 100.0, registry=registry)
    r.apply(p)
    return r, registry


def infeasible_total(registry: CollectorRegistry, slo: str, action: str) -> float:
    value = registry.get_sample_value(
        "goodput_gateway_admission_infeasible_total", {"slo": slo, "action": action}
    )
    return value or 0.0


def overload_total(registry: CollectorRegistry) -> float:
    return sum(
        s.value
        for m in registry.collect()
        if m.name == "goodput_gateway_admission_rejections"
        for s in m.samples
        if s.name.endswith("_total")
    )


def test_a_hand_off_learned_under_load_makes_no_short_prompt_infeasible() -> None:
    # The learned hand-off holds the decode leg's queueing: after an overload it can exceed
    # the objective by itself, which says nothing about an idle instance.
    loaded = dataclasses.replace(MODEL, kv_handoff_s=2 * TTFT_S)
    r, registry = rule(policy("reject", model=loaded))
    decision = r.decide(info(LIMIT // 10))
    assert not decision.infeasible and decision.status_code != 400
    assert sum(r.num_infeasible.values()) == 0 and infeasible_total(registry, "chat", "reject") == 0


def test_reject_answers_400_at_once_naming_the_slo_the_prediction_and_the_objective() -> None:
    r, registry = rule(policy("reject"))
    decision = r.decide(info(LIMIT + 5_000))
    assert not decision.admit
    assert (decision.status_code, decision.error_type) == (400, "infeasible_request")
    assert decision.retry_after_s is None  # retrying cannot help
    assert decision.infeasible
    assert decision.detail() == {
        "slo": "chat",
        "objective": "ttft",
        "predicted": pytest.approx(1.5),
        "allowed": 1.0,
        "infeasible": True,
    }
    assert "slo 'chat': infeasible request" in decision.reason
    assert "idle instance 1.500 s > objective 1 s" in decision.reason
    assert infeasible_total(registry, "chat", "reject") == 1
    assert overload_total(registry) == 0 and r.num_rejected == 0
    assert r.num_infeasible == {"admit": 0, "defer": 0, "reject": 1}
    assert r.in_flight == 0


def test_admit_serves_it_as_best_effort_while_two_prefill_instances_are_idle() -> None:
    r, registry = rule(policy("admit"))
    assert r.decide(info(LIMIT + 1, "sheddable")).admit
    assert infeasible_total(registry, "chat", "admit") == 1
    assert overload_total(registry) == 0
    assert r.in_flight == 1
    r.on_finished("t")
    assert r.in_flight == 0
    r.tracker.add(P1, prefill_tokens=LIMIT + 1)  # it went to P1: P2 must stay for the others
    deferred = r.decide(info(LIMIT + 1))
    assert not deferred.admit and deferred.infeasible
    assert (deferred.status_code, deferred.retry_after_s) == (429, pytest.approx(1.0001))
    reason = deferred.reason
    assert "served as best effort only while 2 of the 2 prefill instances are idle" in reason
    assert infeasible_total(registry, "chat", "defer") == 1
    assert overload_total(registry) == 0 and r.num_rejected == 0


def test_admit_defers_it_while_the_prefill_queue_is_not_empty() -> None:
    r, registry = rule(policy("admit"), queued=50_000)
    assert not r.decide(info(LIMIT + 1, "sheddable")).admit
    assert r.num_infeasible == {"admit": 0, "defer": 1, "reject": 0}
    assert overload_total(registry) == 0


def test_never_shed_traffic_is_admitted_and_counted_even_where_the_slo_rejects() -> None:
    r, registry = rule(policy("reject"))
    assert r.decide(info(LIMIT + 1, "critical")).admit
    assert infeasible_total(registry, "chat", "admit") == 1
    # No room is kept for it: no room could make it meet the objective.
    assert r.never_shed.rate(100.0) == 0.0


def test_the_threshold_is_the_objective_itself_not_the_margin_or_the_headroom() -> None:
    r, registry = rule(policy("reject", margin=0.5))
    decision = r.decide(info(LIMIT, "sheddable"))  # feasible on an idle instance
    assert decision.objective == "ttft" and decision.status_code == 429  # refused for load
    assert not decision.infeasible
    assert r.decide(info(LIMIT + 1, "sheddable")).status_code == 400
    assert infeasible_total(registry, "chat", "reject") == 1


def test_the_fastest_instance_rate_decides() -> None:
    fast = MODEL.to_json() | {"instance_prefill_tokens_per_s": {P2: 2 * RATE}}
    r, _ = rule(policy("reject", model=AdmissionModel.from_json(fast)))
    decision = r.decide(info(LIMIT + 1))  # on P2 it could: judged for load (routed to P1)
    assert not decision.infeasible and not any(r.num_infeasible.values())


def test_an_slo_outside_the_policy_uses_the_class_ttft_and_admits() -> None:
    classes = {**CLASSES, "standard": ClassPolicy(shed_order=1, ttft_s=TTFT_S)}
    r, registry = rule(policy("reject", classes=classes))
    assert r.decide(info(LIMIT + 1, slo="unknown")).admit
    assert infeasible_total(registry, "other", "admit") == 1


def test_without_a_model_nothing_is_called_infeasible() -> None:
    r, _ = rule(policy("reject", model=None))
    assert r.decide(info(10**7)).admit
    assert r.num_infeasible == {"admit": 0, "defer": 0, "reject": 0}


def test_contract_round_trip_and_refusal() -> None:
    p = policy("reject")
    assert p.to_json()["slos"]["chat"]["infeasible"] == "reject"
    assert AdmissionPolicy.from_json(p.to_json()) == p
    assert "infeasible" not in policy("admit").to_json()["slos"]["chat"]  # written as before
    with pytest.raises(CommandError, match=r"policy\.slos\.chat\.infeasible.*'admit', 'reject'"):
        AdmissionPolicy.from_json(
            p.to_json() | {"slos": {"chat": p.slos["chat"].to_json() | {"infeasible": "drop"}}}
        )


@given(
    prompt=st.integers(1, 4 * LIMIT),
    queued=st.integers(0, 40_000),
    priority=st.sampled_from(["critical", "standard", "sheddable", "other"]),
    action=st.sampled_from(["admit", "reject"]),
    margin=st.floats(0.3, 1.0),
)
def test_infeasible_is_never_shed_for_load_and_feasible_is_never_infeasible(
    prompt: int, queued: int, priority: str, action: str, margin: float
) -> None:
    r, registry = rule(policy(action, margin=margin), queued=queued)
    decision = r.decide(info(prompt, priority))
    idle_s = prompt / RATE
    counted = sum(r.num_infeasible.values())
    if idle_s > TTFT_S:  # infeasible: counted apart, never as load shedding
        assert counted == 1
        assert overload_total(registry) == 0 and r.num_rejected == 0
        if priority == "critical":
            assert decision.admit
        elif action == "reject":
            assert decision.infeasible and decision.status_code == 400
        else:  # best effort where a prefill instance is spare, deferred otherwise
            assert decision.admit == (queued == 0)
            assert decision.admit or (decision.infeasible and decision.status_code == 429)
    else:  # feasible: never called infeasible, whatever the load says
        assert counted == 0 and not decision.infeasible
        assert decision.admit or decision.status_code == 429
