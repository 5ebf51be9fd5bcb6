"""The knee search on monotone synthetic functions (no simulator)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from serving.sim.experiments.knee import find_knee


def step(at: float, high: float = 1.0, low: float = 0.5) -> Callable[[float], float]:
    return lambda rate: high if rate <= at else low


@pytest.mark.parametrize("start", [0.01, 1.0, 3.7, 50.0, 999.0])
@pytest.mark.parametrize("at", [0.3, 3.7, 120.0])
def test_knee_brackets_the_crossing_within_tolerance(start: float, at: float) -> None:
    knee = find_knee(step(at), 0.95, start=start, rel_tol=0.02)
    assert knee.bracketed
    assert knee.rate <= at < knee.first_miss
    assert knee.first_miss / knee.rate <= 1.02
    # Every probe is recorded, and the knee is one of them.
    assert knee.rate in [rate for rate, _ in knee.probes]


def test_smooth_monotone_attainment() -> None:
    # attainment falls smoothly with load; crossing 0.99 at rate 10.
    def attainment(rate: float) -> float:
        return 1.0 - 0.01 * (rate / 10.0) ** 3

    knee = find_knee(attainment, 0.99, start=1.0, rel_tol=0.01)
    assert knee.rate == pytest.approx(10.0, rel=0.01)
    assert attainment(knee.rate) >= 0.99 > attainment(knee.first_miss)


def test_no_crossing_up_to_max_rate_is_not_bracketed() -> None:
    knee = find_knee(lambda rate: 1.0, 0.95, start=1.0, max_rate=64.0)
    assert knee.rate == 64.0 and math.isinf(knee.first_miss) and not knee.bracketed


def test_never_meeting_target_gives_zero() -> None:
    knee = find_knee(lambda rate: 0.0, 0.95, start=1.0, min_rate=0.25)
    assert knee.rate == 0.0 and knee.first_miss == 0.25 and not knee.bracketed


def test_probe_budget_is_respected() -> None:
    calls: list[float] = []

    def measure(rate: float) -> float:
        calls.append(rate)
        return 1.0 if rate <= 5.0 else 0.0

    knee = find_knee(measure, 0.5, start=1.0, rel_tol=1e-6, max_probes=6)
    assert len(calls) == len(knee.probes) == 6
    assert knee.rate <= 5.0 < knee.first_miss


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": 0.0}, "start"),
        ({"rel_tol": 0.0}, "rel_tol"),
        ({"start": 1e5}, "start"),
    ],
)
def test_invalid_arguments_name_the_field(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        find_knee(
            step(1.0), 0.95, start=kwargs.get("start", 1.0), rel_tol=kwargs.get("rel_tol", 0.05)
        )
