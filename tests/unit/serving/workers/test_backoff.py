"""Restart backoff: doubling delays, a cap, and a reset after a lasting success."""

from __future__ import annotations

import pytest

from serving.workers import RestartBackoff


def test_delays_double_up_to_the_cap() -> None:
    backoff = RestartBackoff(initial_s=1.0, max_s=10.0)

    assert [backoff.failure() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.num_failures == 6
    assert backoff.streak == 6


def test_a_short_success_keeps_the_streak_a_lasting_one_resets_it() -> None:
    backoff = RestartBackoff(initial_s=0.5, max_s=60.0, reset_after_s=30.0)
    backoff.failure()
    backoff.failure()

    backoff.success(healthy_for_s=5.0)
    assert backoff.peek() == 2.0
    backoff.success(healthy_for_s=30.0)
    assert backoff.peek() == 0.5
    assert backoff.num_failures == 2


def test_an_instant_success_resets_at_once() -> None:
    backoff = RestartBackoff(initial_s=1.0, max_s=30.0)
    backoff.failure()

    backoff.success()

    assert backoff.failure() == 1.0


def test_a_long_streak_stays_at_the_cap_without_overflow() -> None:
    backoff = RestartBackoff(initial_s=1.0, max_s=30.0, multiplier=1e6)
    for _ in range(5000):
        backoff.failure()

    assert backoff.peek() == 30.0


def test_multiplier_one_is_a_constant_delay() -> None:
    backoff = RestartBackoff(initial_s=2.0, max_s=2.0, multiplier=1.0)

    assert [backoff.failure() for _ in range(3)] == [2.0, 2.0, 2.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"initial_s": 0.0}, "initial_s must be > 0, got 0.0"),
        ({"initial_s": 5.0, "max_s": 1.0}, "max_s must be >= initial_s (5.0), got 1.0"),
        ({"multiplier": 0.5}, "multiplier must be >= 1, got 0.5"),
        ({"reset_after_s": -1.0}, "reset_after_s must be >= 0, got -1.0"),
    ],
)
def test_invalid_settings(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        RestartBackoff(**kwargs)
    assert str(caught.value) == message
