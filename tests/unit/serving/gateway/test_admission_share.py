"""Several gateways in front of the same instances: each applies its ``share_ratio`` of the
fleet's capacity (the contract field, the rule's scaled load, the split fallback cap, the
offered rate it reports), and together they admit what one gateway would."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from controlplane.policies.admission import gateway_shares
from exporters.admission import AdmissionModel, AdmissionPolicy, ClassPolicy, SLOAdmission
from exporters.commands import CommandError
from exporters.fleet import OFFERED_RPS, PoolRole
from exporters.sinks import InMemorySink
from serving.gateway import Gateway, GatewayConfig
from serving.gateway.admission import RequestInfo
from serving.gateway.admission_load import LoadTracker
from serving.gateway.admission_policy import PolicyAdmission
from serving.gateway.control import ControlPlaneLink
from serving.gateway.routing import InstanceState

P1, D1 = "http://p1", "http://d1"
MODEL = AdmissionModel(
    prefill_tokens_per_s=10_000.0,
    kv_handoff_s=0.01,
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


def policy(share: float = 1.0, **kw: Any) -> AdmissionPolicy:
    args: dict[str, Any] = {
        "version": 1,
        "ttl_s": 30.0,
        "fallback_max_concurrency": 10,
        "classes": CLASSES,
        "slos": {"chat": SLOAdmission(ttft_s=1.0, itl_s=0.05)},
        "model": MODEL,
        "share_ratio": share,
    }
    args.update(kw)
    return AdmissionPolicy(**args)


def info(priority: str = "standard", prompt: int = 1000, request_id: str = "r") -> RequestInfo:
    return RequestInfo(request_id, "m", "t", "chat", priority, prompt, 100, True, 0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tracker(prefill_tokens: int = 0, decode_streams: int = 0) -> LoadTracker:
    t = LoadTracker()
    t.sync(
        [InstanceState(P1, P1, PoolRole.PREFILL, prefill_tokens=prefill_tokens),
         InstanceState(D1, D1, PoolRole.DECODE, decode_streams=decode_streams)]
    )  # fmt: skip
    return t


def rule(t: LoadTracker, p: AdmissionPolicy) -> tuple[PolicyAdmission, Clock]:
    clock = Clock()
    r = PolicyAdmission(t, clock_s=clock, registry=CollectorRegistry())
    r.apply(p)
    return r, clock


# -- the contract ---------------------------------------------------------------------


def test_share_round_trips_and_is_written_only_below_one() -> None:
    half = policy(0.5)
    assert half.to_json()["share_ratio"] == 0.5
    assert AdmissionPolicy.from_json(json.loads(json.dumps(half.to_json()))) == half
    whole = policy()
    assert "share_ratio" not in whole.to_json()  # a one-gateway policy reads as before
    body = whole.to_json()
    assert AdmissionPolicy.from_json(body).share_ratio == 1.0  # an old policy: share 1


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, float("nan"), "0.5", True])
def test_a_bad_share_is_refused_naming_the_field(bad: object) -> None:
    body = policy().to_json()
    body["share_ratio"] = bad
    with pytest.raises(CommandError) as caught:
        AdmissionPolicy.from_json(body)
    assert str(caught.value) == f"policy.share_ratio: must be a number in (0.0, 1.0], got {bad!r}"


@given(
    cap=st.integers(1, 10_000),
    rates=st.lists(st.floats(0, 1000, allow_nan=False), min_size=1, max_size=16),
)
def test_the_fallback_caps_split_the_fleet_cap(cap: int, rates: list[float]) -> None:
    shares = gateway_shares({f"gw-{k}": r for k, r in enumerate(rates)})
    caps = [policy(s, fallback_max_concurrency=cap).fallback_cap() for s in shares.values()]
    assert all(c >= 1 for c in caps)
    # Each part is its share of the cap rounded (at most half a request off), or the floor
    # of 1 where the share is under half a request (1 - share x cap off); so is the sum.
    # (caps [1, 1, 2] for a cap of 2: shares 0.25, 0.25, 0.75 are 0.75 + 0.75 + 0.5 off.)
    off = [max(0.5, 1 - s * cap) for s in shares.values()]
    parts = zip(caps, shares.values(), off, strict=True)
    assert all(abs(c - s * cap) <= o + 1e-9 for c, s, o in parts)
    assert abs(sum(caps) - cap) <= sum(off) + 1e-9
    assert policy(1.0, fallback_max_concurrency=cap).fallback_cap() == cap


# -- the rule -----------------------------------------------------------------------------


@given(
    queued=st.integers(0, 50_000),
    streams=st.integers(0, 200),
    in_prefill=st.integers(0, 20),
    share=st.floats(0.01, 1.0),
    prompt=st.integers(1, 8000),
    priority=st.sampled_from(["standard", "sheddable"]),
)
@settings(max_examples=200, deadline=None)
def test_a_share_reads_the_fleet_as_its_own_load_divided_by_the_share(
    queued: int, streams: int, in_prefill: int, share: float, prompt: int, priority: str
) -> None:
    """A gateway with ``share`` and its own load decides as the only gateway would with
    that load ÷ ``share``: the queued tokens, the decode streams, the requests in prefill."""
    mine = tracker(queued, streams)
    mine.prefill_requests = in_prefill
    fleet = tracker(0, 0)
    fleet.min_prefill_tokens = queued / share  # type: ignore[assignment]
    fleet.decode_streams = streams / share  # type: ignore[assignment]
    fleet.prefill_requests = in_prefill / share  # type: ignore[assignment]
    split, _ = rule(mine, policy(share))
    whole, _ = rule(fleet, policy(1.0))
    request = info(priority, prompt)
    assert split._ttft_s(MODEL, request) == pytest.approx(whole._ttft_s(MODEL, request))
    a, b = split.decide(request), whole.decide(request)
    if a.admit != b.admit:  # only on the boundary, within rounding
        rejected = b if a.admit else a
        assert rejected.predicted == pytest.approx(rejected.allowed, rel=1e-6)
    elif not a.admit:
        assert (a.objective, a.predicted, a.allowed) == (
            b.objective,
            pytest.approx(b.predicted),
            pytest.approx(b.allowed),
        )


def test_share_one_decides_exactly_as_before() -> None:
    for queued in (0, 3000, 9000, 20_000):
        old = PolicyAdmission(tracker(queued, 10), clock_s=Clock())
        old.apply(policy().__class__.from_json(policy().to_json()))
        new, _ = rule(tracker(queued, 10), policy(1.0))
        for priority in ("standard", "sheddable", "critical"):
            assert old.decide(info(priority)) == new.decide(info(priority))


def test_the_message_names_the_share() -> None:
    r, _ = rule(tracker(6000), policy(0.5))
    decision = r.decide(info("standard", 1000))
    assert not decision.admit
    # 6000 queued here ÷ 0.5 = 12000 in the fleet, + 1000 of its own, at 10000 tokens/s.
    assert decision.predicted == pytest.approx(1.31)
    assert "this gateway's share 0.5 of the fleet" in decision.reason, decision.reason


def test_the_fallback_cap_is_the_gateways_share() -> None:
    r, clock = rule(tracker(), policy(0.3, fallback_max_concurrency=10))
    clock.now += 31.0  # past the TTL: fallback
    assert r.mode() == "fallback"
    decisions = [r.decide(info("standard", 10, f"r{k}")) for k in range(5)]
    assert [d.admit for d in decisions] == [True, True, True, False, False]
    assert decisions[3].allowed == 3.0 and decisions[3].objective == "concurrency"
    assert r.decide(info("critical", 10)).admit  # never-shed classes still admitted


def test_the_room_for_never_shed_traffic_is_the_fleets() -> None:
    """The never-shed arrival rate seen here ÷ the share is the fleet's."""
    rates = []
    for share in (1.0, 0.25):
        r, clock = rule(tracker(), policy(share))
        for _ in range(20):
            r.decide(info("critical", 500))
            clock.now += 0.1
        rates.append(r._reserve_s(MODEL, 1.0, clock.now))
    assert rates[1] == pytest.approx(4 * rates[0])


def test_offered_requests_are_counted_admitted_or_not_and_the_share_is_exported() -> None:
    t = tracker(50_000)
    registry = CollectorRegistry()
    clock = Clock()
    r = PolicyAdmission(t, clock_s=clock, registry=registry)
    assert r.offered_rps() == 0.0
    assert registry.get_sample_value("goodput_gateway_admission_share_ratio") == 1.0
    for k in range(100):  # 10 requests/s for 10 s, before any policy and with one
        if k == 50:
            r.apply(policy(0.4))
        r.decide(info("standard", 1000, f"r{k}"))
        clock.now += 0.1
    assert r.num_rejected == 50  # all refused once the policy came: the queue is long
    assert r.offered_rps() == pytest.approx(10.0, rel=0.1)
    assert registry.get_sample_value("goodput_gateway_admission_share_ratio") == 0.4


async def test_the_heartbeat_reports_the_offered_rate() -> None:
    bodies: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={})

    gateway = Gateway(
        GatewayConfig(control_plane="http://cp:8000", gateway_id="gw-1", agent_key="k"),
        sink=InMemorySink(),
        registry=CollectorRegistry(),
    )
    clock = Clock()
    gateway.admission = PolicyAdmission(gateway.load, clock_s=clock)
    for _ in range(30):
        gateway.admission.decide(info())
        clock.now += 0.2
    control = ControlPlaneLink(gateway, transport=httpx.MockTransport(handle))
    assert await control.beat()
    assert await control.beat()
    for body in bodies:
        assert body["load"][OFFERED_RPS] == pytest.approx(5.0, rel=0.1), body
    await control.stop()


# -- together: N gateways admit what one would ----------------------------------------


def _admitted_tokens(share: float, prompts: list[int], allowed_s: float) -> int:
    """Prompt tokens one gateway with ``share`` admits from ``prompts`` (all ``standard``)
    onto one prefill instance that drains nothing meanwhile."""
    t = tracker()
    r, _ = rule(t, policy(share, slos={"chat": SLOAdmission(ttft_s=allowed_s)}))
    admitted = 0
    for k, prompt in enumerate(prompts):
        if r.decide(info("standard", prompt, f"r{k}")).admit:
            t.add(P1, prefill_tokens=prompt)
            admitted += prompt
    return admitted


@given(
    data=st.data(),
    num_gateways=st.integers(1, 6),
    prompt=st.integers(100, 4000),
    allowed_s=st.floats(0.5, 5.0),
)
@settings(max_examples=150, deadline=None)
def test_n_gateways_with_shares_by_arrival_rate_admit_what_one_gateway_admits(
    data: st.DataObject, num_gateways: int, prompt: int, allowed_s: float
) -> None:
    """Any split of the arrivals across N gateways, each with the share
    :func:`gateway_shares` gives for its arrival count: the budgets they admit add up to
    the one gateway's, within one request per gateway (each stops at its own boundary)."""
    one_budget = _admitted_tokens(1.0, [prompt] * 1000, allowed_s)
    # Enough offered load that every gateway fills its part: 2x the budget or more each.
    base = 2 * one_budget // prompt + 2
    counts = [
        data.draw(st.integers(base, 4 * base), label=f"arrivals {g}") for g in range(num_gateways)
    ]
    shares = gateway_shares({f"gw-{g}": float(n) for g, n in enumerate(counts)}, floor_ratio=0)
    assert sum(shares.values()) == pytest.approx(1.0)
    together = sum(
        _admitted_tokens(shares[f"gw-{g}"], [prompt] * n, allowed_s) for g, n in enumerate(counts)
    )
    assert abs(together - one_budget) <= num_gateways * prompt, (together, one_budget, shares)


def test_two_gateways_without_shares_admit_twice_as_much() -> None:
    """What the share guards against: two gateways each believing it is alone."""
    one = _admitted_tokens(1.0, [1000] * 100, 2.0)
    unaware = 2 * _admitted_tokens(1.0, [1000] * 50, 2.0)
    aware = 2 * _admitted_tokens(0.5, [1000] * 50, 2.0)
    assert unaware == 2 * one
    assert abs(aware - one) <= 2 * 1000
