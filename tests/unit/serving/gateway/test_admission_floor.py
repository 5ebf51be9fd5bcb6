"""The availability floor: the admission rule's guard against starving one prompt-length
class (``serving.gateway.admission_policy``; the policy's ``prompt_class_bounds`` and
``availability_floor``)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from exporters.admission import AdmissionModel, AdmissionPolicy, SLOAdmission, prompt_class
from exporters.commands import CommandError
from exporters.fleet import PoolRole
from serving.gateway.admission import RequestInfo
from serving.gateway.admission_load import LoadTracker
from serving.gateway.admission_policy import ClassAvailability, PolicyAdmission, below_floor
from serving.gateway.routing import InstanceState

P1, D1 = "http://p1", "http://d1"
#: 10 000 prompt tokens/s and a 1-s TTFT: with 5 000 tokens queued, a 4 000-token prompt
#: is predicted at 0.9 s (admitted), a 6 000-token one at 1.1 s (refused).
MODEL = AdmissionModel(prefill_tokens_per_s=10_000.0, max_decode_batch=10_000)
QUEUED = 5_000
SHORT, LONG = 4_000, 6_000


def policy(floor: float, bounds: tuple[int, ...] = (5_000,)) -> AdmissionPolicy:
    return AdmissionPolicy(
        version=1,
        ttl_s=3600.0,
        fallback_max_concurrency=10**6,
        slos={"chat": SLOAdmission(ttft_s=1.0)},
        model=MODEL,
        prompt_class_bounds=bounds,
        availability_floor=floor,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def rule(p: AdmissionPolicy) -> tuple[PolicyAdmission, Clock]:
    t = LoadTracker()
    t.sync(
        [InstanceState(P1, P1, PoolRole.PREFILL, prefill_tokens=QUEUED),
         InstanceState(D1, D1, PoolRole.DECODE)]
    )  # fmt: skip
    clock = Clock()
    r = PolicyAdmission(t, clock_s=clock, registry=CollectorRegistry())
    r.apply(p)
    return r, clock


def info(prompt: int) -> RequestInfo:
    return RequestInfo("r", "m", "t", "chat", "standard", prompt, 10, True, 0.0)


def run(r: PolicyAdmission, clock: Clock, prompts: list[int]) -> dict[int, list[bool]]:
    out: dict[int, list[bool]] = {SHORT: [], LONG: []}
    for p in prompts:
        clock.now += 0.01
        out[p].append(r.decide(info(p)).admit)
    return out


@given(
    steps=st.lists(st.tuples(st.booleans(), st.floats(0.0, 1.0)), min_size=1, max_size=300),
    floor=st.floats(0.0, 0.999),
)
def test_a_floored_class_keeps_its_floor_within_one_request(
    steps: list[tuple[bool, float]], floor: float
) -> None:
    """Whatever the base rule decides and however the counts decay between arrivals, a
    class whose refusals are overturned while it is below the floor keeps
    admitted >= floor * offered - 1."""
    admitted = offered = 0.0
    for base_admits, decay in steps:
        admitted *= decay
        offered *= decay
        offered += 1.0
        if base_admits or below_floor(admitted, offered, floor):
            admitted += 1.0
        assert admitted >= floor * offered - 1.0 - 1e-9


@given(
    bounds=st.lists(st.integers(1, 10**6), max_size=8, unique=True).map(sorted),
    prompt=st.integers(0, 2 * 10**6),
)
def test_prompt_class_counts_the_bounds_below(bounds: list[int], prompt: int) -> None:
    cls = prompt_class(tuple(bounds), prompt)
    assert cls == sum(1 for b in bounds if b < prompt)
    assert cls == 0 or bounds[cls - 1] < prompt
    assert cls == len(bounds) or prompt <= bounds[cls]


def test_without_the_floor_the_long_class_starves() -> None:
    r, clock = rule(policy(0.0))
    out = run(r, clock, [SHORT, LONG] * 200)
    assert all(out[SHORT]) and not any(out[LONG])


def test_the_floor_keeps_a_starved_class_at_its_share() -> None:
    for pattern in ([SHORT, LONG], [LONG, SHORT, SHORT, SHORT]):
        r, clock = rule(policy(0.5))
        out = run(r, clock, pattern * 100)
        long_avail = sum(out[LONG]) / len(out[LONG])
        overall = (sum(out[SHORT]) + sum(out[LONG])) / (len(out[SHORT]) + len(out[LONG]))
        assert long_avail >= 0.5 * overall - 0.01
        assert r.num_floor_admitted == sum(out[LONG]) > 0
    # A short request arriving while the long class is starved is judged with the policy's
    # over_share_ratio (0.8): predicted 0.9 s > 0.8 s, so it is refused to leave room.
    assert not all(out[SHORT])
    assert math.isclose(
        r.availability.ratio(1), r.availability.admitted[1] / r.availability.offered[1]
    )


def test_the_floor_only_turns_refusals_into_admissions() -> None:
    """Each long request is refused by the prediction: the floor admits some. A short one
    is admitted by the prediction: the floor never refuses it (crowding out aside, which
    the policy's over_share_ratio of 1 switches off here)."""
    p = AdmissionPolicy(
        version=1,
        ttl_s=3600.0,
        fallback_max_concurrency=10**6,
        slos={"chat": SLOAdmission(ttft_s=1.0)},
        model=MODEL,
        over_share_ratio=1.0,
        prompt_class_bounds=(5_000,),
        availability_floor=0.9,
    )
    r, clock = rule(p)
    out = run(r, clock, [SHORT, LONG, LONG, SHORT] * 50)
    assert all(out[SHORT]) and any(out[LONG])


def test_one_class_or_a_zero_floor_is_no_guard() -> None:
    for p in (policy(0.9, bounds=()), policy(0.0)):
        r, clock = rule(p)
        out = run(r, clock, [LONG] * 20)
        assert not any(out[LONG]) and r.num_floor_admitted == 0


def test_counts_decay_over_the_window() -> None:
    avail = ClassAvailability(window_s=10.0)
    avail.offer(0, 0.0)
    avail.offer(1, 0.0)
    avail.admit(1)
    assert avail.overall() == 0.5 and avail.starved(0, 0.5)
    avail.offer(0, 10.0)
    avail.admit(0)
    assert avail.offered[0] == pytest.approx(1.0 + math.exp(-1.0))
    assert avail.admitted[1] == pytest.approx(math.exp(-1.0))
    with pytest.raises(ValueError, match="window_s"):
        ClassAvailability(window_s=0.0)


def test_the_policy_carries_the_floor_and_refuses_bad_values() -> None:
    p = policy(0.5, bounds=(100, 1_000))
    obj = p.to_json()
    assert obj["prompt_class_bounds"] == [100, 1_000] and obj["availability_floor"] == 0.5
    assert AdmissionPolicy.from_json(obj) == p
    assert "availability_floor" not in policy(0.0, bounds=()).to_json()
    with pytest.raises(CommandError, match="strictly ascending"):
        AdmissionPolicy.from_json({**obj, "prompt_class_bounds": [1_000, 100]})
    with pytest.raises(CommandError, match=r"availability_floor: must be a number in \[0.0, 1.0\)"):
        AdmissionPolicy.from_json({**obj, "availability_floor": 1.0})
    with pytest.raises(CommandError, match="at most 16 integers"):
        AdmissionPolicy.from_json({**obj, "prompt_class_bounds": list(range(1, 18))})
