"""Each gateway's share of the fleet's capacity (``gateway_shares``), and the offered rate
read from a heartbeat's load."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from controlplane.policies.admission import MIN_SHARE_RATIO, AdmissionConfig, gateway_shares
from controlplane.runtime.admission import offered_rps

RATE = st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False))
#: Any finite rate: subnormal ones (a product underflowed before the division) and ones near
#: the float maximum (their sum overflowed).
ANY_RATE = st.one_of(st.none(), st.floats(0, allow_nan=False, allow_infinity=False))


@given(rates=st.lists(ANY_RATE, min_size=1, max_size=32), floor=st.floats(0, 1))
@example(rates=[None, 5e-324], floor=0.5)  # found by this test: the shares summed to 0.5
@example(rates=[1.7e308, 1.7e308, None], floor=0.1)
def test_shares_sum_to_one_and_each_is_a_ratio(rates: list[float | None], floor: float) -> None:
    shares = gateway_shares({f"gw-{k}": r for k, r in enumerate(rates)}, floor_ratio=floor)
    assert set(shares) == {f"gw-{k}" for k in range(len(rates))}
    assert all(MIN_SHARE_RATIO <= s <= 1.0 for s in shares.values())
    assert math.fsum(shares.values()) == pytest.approx(1.0, abs=len(rates) * MIN_SHARE_RATIO)
    assert all(s >= floor / len(rates) - 1e-12 for s in shares.values())


@given(rates=st.lists(st.floats(0.01, 1e4), min_size=1, max_size=16))
def test_without_a_floor_the_shares_follow_the_offered_rates(rates: list[float]) -> None:
    shares = gateway_shares({f"gw-{k}": r for k, r in enumerate(rates)}, floor_ratio=0.0)
    total = sum(rates)
    for k, r in enumerate(rates):
        assert shares[f"gw-{k}"] == pytest.approx(max(r / total, MIN_SHARE_RATIO))


@given(rate=RATE, floor=st.floats(0, 1))
def test_a_lone_gateway_gets_exactly_one(rate: float | None, floor: float) -> None:
    """Exactly 1, so its policy omits the field and decides as before (not 1 − ε)."""
    assert gateway_shares({"gw": rate}, floor_ratio=floor) == {"gw": 1.0}


def test_one_gateway_gets_everything() -> None:
    assert gateway_shares({"gw": 12.0}) == {"gw": 1.0}
    assert gateway_shares({"gw": None}) == {"gw": 1.0}
    assert gateway_shares({"gw": 0.0}) == {"gw": 1.0}
    assert gateway_shares({}) == {}


def test_no_traffic_reported_splits_evenly() -> None:
    assert gateway_shares({"a": 0.0, "b": 0.0, "c": None, "d": None}) == dict.fromkeys("abcd", 0.25)


def test_an_unreported_gateway_counts_as_the_mean_and_an_idle_one_keeps_the_floor() -> None:
    shares = gateway_shares({"a": 30.0, "b": 10.0, "c": None}, floor_ratio=0.0)
    assert shares == pytest.approx({"a": 0.5, "b": 1 / 6, "c": 1 / 3})
    idle = gateway_shares({"busy": 20.0, "idle": 0.0}, floor_ratio=0.1)
    assert idle == pytest.approx({"busy": 0.95, "idle": 0.05})


def test_bad_floors_are_refused() -> None:
    with pytest.raises(ValueError, match=r"floor_ratio must be in \[0, 1\], got 1.5"):
        gateway_shares({"a": 1.0}, floor_ratio=1.5)
    with pytest.raises(ValueError, match="gateway_share_floor_ratio must be in"):
        AdmissionConfig(gateway_share_floor_ratio=-0.1)


@pytest.mark.parametrize(
    ("load", "expected"),
    [
        ({"offered_rps": 3.5}, 3.5),
        ({"offered_rps": 0}, 0.0),
        ({"in_flight": 2}, None),
        ({"offered_rps": -1.0}, None),
        ({"offered_rps": "3"}, None),
        ({"offered_rps": True}, None),
        ({"offered_rps": float("inf")}, None),
        (None, None),
    ],
)
def test_the_offered_rate_from_a_heartbeat(load: object, expected: float | None) -> None:
    assert offered_rps(load) == expected
