"""Room for the never-shed traffic: the arrival rate it is judged by (:class:`TokenRate`) and
how it lessens the sheddable classes' allowed TTFT (docs/admission.md, "Live on vLLM")."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from exporters.admission import AdmissionModel, AdmissionPolicy, ClassPolicy, SLOAdmission
from exporters.fleet import PoolRole
from serving.gateway.admission import RequestInfo
from serving.gateway.admission_load import LoadTracker
from serving.gateway.admission_policy import RESERVE_WINDOW_S, PolicyAdmission, TokenRate
from serving.gateway.routing import InstanceState

MODEL = AdmissionModel(prefill_tokens_per_s=10_000.0, kv_handoff_s=0.01)
CLASSES = {
    "critical": ClassPolicy(shed_order=2, sheddable=False),
    "standard": ClassPolicy(shed_order=1),
    "sheddable": ClassPolicy(shed_order=0, headroom_ratio=0.6),
}
POLICY = AdmissionPolicy(
    version=1,
    ttl_s=1e9,
    fallback_max_concurrency=8,
    classes=CLASSES,
    slos={"chat": SLOAdmission(ttft_s=1.0)},
    model=MODEL,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_rule(prefill: tuple[int, ...]) -> tuple[PolicyAdmission, Clock]:
    tracker = LoadTracker()
    tracker.sync(
        [InstanceState(f"p{i}", f"p{i}", PoolRole.PREFILL, prefill_tokens=q)
         for i, q in enumerate(prefill)]
        + [InstanceState("d", "d", PoolRole.DECODE)]
    )  # fmt: skip
    clock = Clock()
    rule = PolicyAdmission(tracker, clock_s=clock, registry=CollectorRegistry())
    rule.apply(POLICY)
    return rule, clock


def req(priority: str, prompt: int = 1000) -> RequestInfo:
    return RequestInfo("r", "m", "t", "chat", priority, prompt, 8, True, 0.0)


# -- TokenRate ---------------------------------------------------------------------------


def test_no_arrivals_read_zero_and_a_bad_window_is_refused() -> None:
    assert TokenRate().rate(5.0) == 0.0
    with pytest.raises(ValueError, match="window_s"):
        TokenRate(0.0)


@given(
    tokens=st.floats(1.0, 5_000.0),
    gap_s=st.floats(0.01, 1.0),
    count=st.integers(20, 400),
    window_s=st.floats(5.0, 60.0),
)
def test_a_steady_stream_reads_its_rate_from_the_start(
    tokens: float, gap_s: float, count: int, window_s: float
) -> None:
    rate = TokenRate(window_s)
    for i in range(count):
        rate.add(tokens, i * gap_s)
    # Just after the last arrival of a steady stream: within one arrival of the truth
    # (the decayed count holds the last arrival whole), once a tenth of a window passed.
    seconds = (count - 1) * gap_s
    if seconds >= window_s / 10:
        got = rate.rate(seconds + gap_s / 2)
        true = tokens / gap_s
        assert got == pytest.approx(true, rel=gap_s / min(seconds, window_s) + 0.05)


@given(
    arrivals=st.lists(
        st.tuples(st.floats(0.0, 10_000.0), st.floats(0.0, 100.0)), min_size=1, max_size=50
    ),
    later=st.lists(st.floats(0.0, 1_000.0), min_size=2, max_size=10),
)
def test_non_negative_and_decays_once_arrivals_stop(
    arrivals: list[tuple[float, float]], later: list[float]
) -> None:
    rate = TokenRate()
    now = 0.0
    for tokens, gap in arrivals:
        now += gap
        rate.add(tokens, now)
    readings = [rate.rate(now + dt) for dt in sorted(later)]
    assert all(r >= 0 and math.isfinite(r) for r in readings)
    # After a tenth of a window the span only grows and the count only decays.
    settled = [rate.rate(now + RESERVE_WINDOW_S / 10 + dt) for dt in sorted(later)]
    assert all(a >= b - 1e-9 * max(1.0, a) for a, b in itertools.pairwise(settled))


# -- the rule ----------------------------------------------------------------------------


def test_never_shed_traffic_lessens_the_allowed_ttft_by_its_prefill_time() -> None:
    # One prefill instance at 10k tokens/s, 1 s objective. Critical traffic of 2,000 prompt
    # tokens/s (1,000 every 0.5 s for a window): 2,000 tokens expected within the
    # objective = 0.2 s of prefill kept for them.
    rule, clock = make_rule((5_000,))
    baseline = rule.decide(req("sheddable"))
    assert not baseline.admit and baseline.allowed == pytest.approx(0.6)
    for _ in range(int(2 * RESERVE_WINDOW_S)):
        clock.now += 0.5
        assert rule.decide(req("critical")).admit  # never shed
    # Within one arrival:
    assert rule._reserve_s(MODEL, 1.0, clock.now) == pytest.approx(0.2, rel=0.1)
    assert rule.decide(req("standard")).admit  # TTFT (5000 + 1000) / 10k + 0.01 = 0.61 s
    tighter = rule.decide(req("sheddable"))
    assert not tighter.admit
    assert tighter.allowed == pytest.approx(0.6 - 0.2, rel=0.1)
    assert "s kept for never-shed traffic" in tighter.reason


def test_the_room_spreads_over_the_prefill_instances() -> None:
    one, clock1 = make_rule((0,))
    two, clock2 = make_rule((0, 0))
    for _ in range(40):
        for rule, clock in ((one, clock1), (two, clock2)):
            clock.now += 0.25
            rule.decide(req("critical", prompt=2_000))
    kept_one = one._reserve_s(MODEL, 1.0, clock1.now)
    assert kept_one == pytest.approx(0.8, rel=0.05)  # 8k tokens/s x 1 s
    assert kept_one == pytest.approx(2 * two._reserve_s(MODEL, 1.0, clock2.now))


def test_without_never_shed_traffic_nothing_changes() -> None:
    rule, clock = make_rule((3_000,))
    for _ in range(50):
        clock.now += 0.1
        rule.decide(req("standard", prompt=100))
    assert rule._reserve_s(MODEL, 1.0, clock.now) == 0.0
    assert rule.decide(req("sheddable")).admit  # 0.41 s <= 0.6 s


@given(
    queue=st.integers(0, 40_000),
    prompt=st.integers(1, 8_000),
    critical=st.lists(st.tuples(st.integers(1, 8_000), st.floats(0.0, 2.0)), max_size=30),
    priority=st.sampled_from(["standard", "sheddable", "unlisted"]),
)
def test_never_shed_traffic_only_turns_admissions_into_refusals(
    queue: int, prompt: int, critical: list[tuple[int, float]], priority: str
) -> None:
    """Monotone: a request the rule admits beside never-shed traffic is admitted without
    it, and the critical requests themselves are always admitted."""
    with_traffic, clock = make_rule((queue,))
    without, clock0 = make_rule((queue,))
    for tokens, gap in critical:
        clock.now += gap
        clock0.now += gap
        assert with_traffic.decide(req("critical", prompt=tokens)).admit
    a = with_traffic.decide(req(priority, prompt))
    b = without.decide(req(priority, prompt))
    assert (not a.admit) or b.admit
    if not a.admit and not b.admit:
        assert a.allowed is not None and b.allowed is not None
        assert a.allowed <= b.allowed + 1e-12
