"""The gateway's SLO-aware admission rule: fixed load snapshots in, decisions out."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from exporters.admission import AdmissionModel, AdmissionPolicy, ClassPolicy, SLOAdmission
from exporters.fleet import PoolRole
from exporters.records import Labels, RequestRecord, Status, Vantage
from serving.gateway.admission import RequestInfo
from serving.gateway.admission_load import LoadTracker
from serving.gateway.admission_policy import AdmissionFeedback, PolicyAdmission
from serving.gateway.routing import InstanceState

P1, P2, D1, D2 = "http://p1", "http://p2", "http://d1", "http://d2"
MODEL = AdmissionModel(
    prefill_tokens_per_s=10_000.0,
    kv_handoff_s=0.01,
    itl_base_s=0.01,
    itl_per_stream_s=0.001,
    itl_per_context_token_s=0.0,
    max_decode_batch=64,
    mean_decode_s=2.0,
    mean_context_tokens=1000.0,
)
CLASSES = {
    "critical": ClassPolicy(shed_order=2, sheddable=False),
    "standard": ClassPolicy(shed_order=1, headroom_ratio=1.0),
    "sheddable": ClassPolicy(shed_order=0, headroom_ratio=0.6),
}


def policy(*, margin: float = 1.0, version: int = 1, **kw: object) -> AdmissionPolicy:
    args: dict[str, object] = {
        "version": version,
        "ttl_s": 30.0,
        "fallback_max_concurrency": 3,
        "classes": CLASSES,
        "slos": {"chat": SLOAdmission(ttft_s=1.0, itl_s=0.05, burn_rate=1.0, margin_ratio=margin)},
        "model": MODEL,
    }
    args.update(kw)
    return AdmissionPolicy(**args)  # type: ignore[arg-type]


def info(
    priority: str = "standard", *, tenant: str = "t", prompt: int = 1000, slo: str = "chat"
) -> RequestInfo:
    return RequestInfo("r", "m", tenant, slo, priority, prompt, 100, True, 0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tracker(prefill: tuple[int, ...] = (0, 0), decode: tuple[int, ...] = (0, 0)) -> LoadTracker:
    t = LoadTracker()
    t.sync(
        [InstanceState(P1, P1, PoolRole.PREFILL, prefill_tokens=prefill[0]),
         InstanceState(P2, P2, PoolRole.PREFILL, prefill_tokens=prefill[1]),
         InstanceState(D1, D1, PoolRole.DECODE, decode_streams=decode[0]),
         InstanceState(D2, D2, PoolRole.DECODE, decode_streams=decode[1])]
    )  # fmt: skip
    return t


def rule(t: LoadTracker, p: AdmissionPolicy | None = None) -> tuple[PolicyAdmission, Clock]:
    clock = Clock()
    r = PolicyAdmission(t, clock_s=clock, registry=CollectorRegistry())
    if p is not None:
        r.apply(p)
    return r, clock


def test_without_a_policy_everything_is_admitted_and_counted() -> None:
    r, _ = rule(tracker(prefill=(10**9, 10**9)))
    assert r.mode() == "allow_all"
    assert all(r.decide(info("sheddable")).admit for _ in range(5))
    assert r.in_flight == 5
    r.on_finished("t")
    assert r.in_flight == 4


def test_lowest_class_is_shed_first_and_critical_never() -> None:
    # Queue of 7,000 tokens on the least-loaded prefill: TTFT = (7000 + 1000) / 10k + 0.01
    # = 0.81 s; allowed 1.0 s for standard, 0.6 s for sheddable.
    r, _ = rule(tracker(prefill=(9_000, 7_000)), policy())
    shed = r.decide(info("sheddable"))
    assert not shed.admit and (shed.slo, shed.objective) == ("chat", "ttft")
    assert shed.predicted == pytest.approx(0.81) and shed.allowed == pytest.approx(0.6)
    assert "slo 'chat': predicted TTFT 0.810 s > allowed 0.600 s" in shed.reason
    assert shed.retry_after_s == 1.0
    assert r.decide(info("standard")).admit
    # Past the standard class's allowance only critical gets in.
    r2, _ = rule(tracker(prefill=(20_000, 30_000)), policy())
    assert not r2.decide(info("standard")).admit and not r2.decide(info("sheddable")).admit
    assert r2.decide(info("critical")).admit
    assert r2.decide(info("unlisted-class")).admit is False  # defaults: sheddable, headroom 1


def test_burn_rate_margin_tightens_the_allowed_latency() -> None:
    load = (7_000, 7_000)
    calm, _ = rule(tracker(prefill=load), policy(margin=1.0))
    burning, _ = rule(tracker(prefill=load), policy(margin=0.7))
    assert calm.decide(info("standard")).admit
    decision = burning.decide(info("standard"))
    assert not decision.admit and decision.allowed == pytest.approx(0.7)
    assert "1 s objective x 0.70 margin" in decision.reason


def test_a_tenant_above_its_fair_share_is_shed_first() -> None:
    t = tracker()
    r, _ = rule(t, policy(tenant_weights={"big": 1.0, "small": 1.0}, over_share_ratio=0.5))
    for _ in range(6):
        assert r.decide(info("standard", tenant="big")).admit
    assert r.decide(info("standard", tenant="small")).admit
    # Now a queue: TTFT 0.71 s. "big" holds 6 of 7 in flight (share 1/2): allowed 0.5 s.
    t.add(P1, prefill_tokens=6_000)
    t.add(P2, prefill_tokens=6_000)
    big = r.decide(info("standard", tenant="big"))
    assert not big.admit and big.allowed == pytest.approx(0.5)
    assert r.decide(info("standard", tenant="small")).admit


def test_decode_load_is_predicted_at_prefill_end_not_now() -> None:
    model = AdmissionModel(
        prefill_tokens_per_s=10_000.0,
        itl_base_s=0.01,
        itl_per_stream_s=0.001,
        max_decode_batch=1000,
        mean_decode_s=0.2,
        mean_context_tokens=0.0,
    )
    p = policy(model=model)
    # 200 streams per decode instance now (ITL now = 0.21 s > 0.05 s) but a 1 s prefill
    # queue: by then exp(-1.01/0.2) of them are left, ITL ~ 0.012 s: admitted.
    busy_now = tracker(prefill=(10_000, 10_000), decode=(200, 200))
    r, _ = rule(busy_now, p)
    assert r.decide(info("critical", prompt=1)).admit
    assert r.decide(info("sheddable", prompt=1, slo="itl-only")).admit
    r_itl, _ = rule(busy_now, policy(model=model, slos={"s": SLOAdmission(itl_s=0.05)}))
    assert r_itl.decide(info("standard", prompt=1, slo="s")).admit
    # Idle decode now, but 120 requests in prefill: they all reach decode first.
    t = tracker(decode=(0, 0))
    for _ in range(120):
        t.add(P1, prefill_tokens=1)
        t.add(P1, prefill_tokens=-1)  # keep the queue short: count requests, not tokens
    assert t.prefill_requests == 0
    for _ in range(120):
        t.add(P2, prefill_tokens=1)
    r2, _ = rule(t, policy(model=model, slos={"s": SLOAdmission(itl_s=0.05)}))
    decision = r2.decide(info("standard", prompt=1, slo="s"))
    assert not decision.admit and decision.objective == "itl"
    assert decision.predicted == pytest.approx(0.01 + 0.001 * 61)  # 120/2 + 1 per instance


def test_fallback_cap_after_the_ttl_and_metrics_say_so() -> None:
    registry = CollectorRegistry()
    clock = Clock()
    r = PolicyAdmission(tracker(), clock_s=clock, registry=registry)

    def mode(name: str) -> float | None:
        return registry.get_sample_value("goodput_gateway_admission_mode", {"mode": name})

    assert mode("allow_all") == 1.0
    r.apply(policy(version=4))
    assert mode("policy") == 1.0
    assert registry.get_sample_value("goodput_gateway_admission_policy_version") == 4
    clock.now += 31.0
    assert r.mode() == "fallback" and mode("fallback") == 1.0 and mode("policy") == 0.0
    assert [r.decide(info("sheddable")).admit for _ in range(4)] == [True, True, True, False]
    capped = r.decide(info("standard"))
    assert not capped.admit and capped.objective == "concurrency"
    assert "fallback concurrency cap reached, predicted 4 requests in flight > allowed 3" in (
        capped.reason
    )
    assert r.decide(info("critical")).admit  # never shed
    r.on_finished("t")
    r.on_finished("t")
    assert r.decide(info("standard")).admit
    sample = registry.get_sample_value(
        "goodput_gateway_admission_rejections_total", {"priority": "standard", "reason": "fallback"}
    )
    assert sample == 1.0
    # A fresh policy ends the fallback.
    r.apply(policy(version=5))
    assert r.mode() == "policy"


def test_a_stale_policy_version_is_refused() -> None:
    r, _ = rule(tracker(), policy(version=7))
    with pytest.raises(ValueError, match="stale: policy version 6 < applied version 7"):
        r.apply(policy(version=6))
    assert r.apply(policy(version=7)).startswith("admission policy version 7 applied")


def test_without_a_model_or_objective_nothing_is_shed_by_latency() -> None:
    r, _ = rule(tracker(prefill=(10**9, 10**9)), policy(model=None))
    assert r.decide(info("sheddable")).admit
    r2, _ = rule(tracker(prefill=(10**9, 10**9)), policy())
    assert r2.decide(info("sheddable", slo="unknown")).admit  # no objective to protect


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(-500, 500), st.integers(-2, 2)), max_size=60)
)
def test_tracker_sums_match_a_full_scan(ops: list[tuple[int, int, int]]) -> None:
    ids = [P1, P2, D1, D2]
    roles = [PoolRole.PREFILL, PoolRole.BOTH, PoolRole.DECODE, PoolRole.DECODE]
    tokens = [0, 0, 0, 0]
    streams = [0, 0, 0, 0]
    t = LoadTracker()
    t.sync([InstanceState(i, i, r) for i, r in zip(ids, roles, strict=True)])
    for k, d_tokens, d_streams in ops:
        t.add(ids[k], prefill_tokens=d_tokens, decode_streams=d_streams)
        tokens[k] = max(0, tokens[k] + d_tokens)
        streams[k] = max(0, streams[k] + d_streams)
    prefill = [tokens[k] for k in range(4) if roles[k] is not PoolRole.DECODE]
    assert t.min_prefill_tokens == min(prefill)
    assert t.min_prefill_id is not None  # one of the least loaded (ties: either)
    assert tokens[ids.index(t.min_prefill_id)] == min(prefill)
    assert t.decode_streams == sum(streams[k] for k in range(4) if roles[k] is not PoolRole.PREFILL)
    assert t.num_decode == 3


def test_retry_after_grows_with_the_excess_and_is_bounded() -> None:
    r, _ = rule(tracker(prefill=(10**7, 10**7)), policy())
    decision = r.decide(info("standard"))
    assert decision.retry_after_s == 60.0 and math.isfinite(decision.predicted or 0.0)


def finished_record(
    request_id: str, ttft_ms: float | None, status: Status = Status.OK
) -> RequestRecord:
    offsets = [] if ttft_ms is None else [round(ttft_ms * 1000), round(ttft_ms * 1000) + 20_000]
    return RequestRecord(
        request_id=request_id,
        vantage=Vantage.GATEWAY,
        arrival_time_ns=1_700_000_000_000_000_000,
        labels=Labels(model="m", tenant="t"),
        emission_offsets_us=np.array(offsets, dtype=np.int64),
        status=status,
    )


def test_predicted_and_observed_ttft_of_the_same_admitted_requests() -> None:
    registry = CollectorRegistry()
    clock = Clock()
    r = PolicyAdmission(tracker(prefill=(2000, 5000)), clock_s=clock, registry=registry)
    feedback = AdmissionFeedback(lambda: r)
    r.decide(RequestInfo("before", "m", "t", "chat", "standard", 1000, 100, True, 0.0))
    r.apply(policy())
    for request_id, priority in (("a", "standard"), ("b", "unknown"), ("c", "standard")):
        assert r.decide(RequestInfo(request_id, "m", "t", "chat", priority, 1000, 100, True, 0.0))
    # (2000 queued + 1000) tokens at 10,000 tokens/s + 10 ms hand-off.
    expected_s = 0.31
    feedback.export(finished_record("before", 100.0))  # admitted before any policy: nothing
    feedback.export(finished_record("a", 400.0))
    feedback.export(finished_record("b", 250.0))
    feedback.export(finished_record("c", None, Status.ERROR))  # failed: its prediction left out

    def sample(suffix: str, priority: str, kind: str, **extra: str) -> float | None:
        labels = {"priority": priority, "kind": kind, **extra}
        return registry.get_sample_value(f"goodput_gateway_admission_ttft_seconds{suffix}", labels)

    for priority, observed_s in (("standard", 0.4), ("other", 0.25)):
        assert (
            sample("_count", priority, "predicted") == sample("_count", priority, "observed") == 1
        )
        assert sample("_sum", priority, "predicted") == pytest.approx(expected_s)
        assert sample("_sum", priority, "observed") == pytest.approx(observed_s)
    assert r._predicted == {}  # every prediction used or dropped with its record


def test_no_prediction_kept_in_fallback_and_at_most_max_predictions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("serving.gateway.admission_policy.MAX_PREDICTIONS", 2)
    r, clock = rule(tracker(), policy())
    for request_id in ("a", "b", "c"):
        r.decide(RequestInfo(request_id, "m", "t", "chat", "standard", 10, 100, True, 0.0))
    assert list(r._predicted) == ["b", "c"] and r.num_predictions_dropped == 1
    clock.now += 31.0  # past the policy's TTL: fallback, no prediction
    r.decide(RequestInfo("d", "m", "t", "chat", "standard", 10, 100, True, 0.0))
    assert "d" not in r._predicted
