"""The demo's closing comparison adds up: requests cancelled at the end of a phase's drain are
counted as such, not dropped from ``sent`` nor counted as failed."""

from __future__ import annotations

from goodput.demo_client import Outcome
from goodput.demo_scenario import PhaseResult, comparison


def _outcome(index: int, status: int, ttft_s: float | None = None, *,
             cancelled: bool = False) -> Outcome:  # fmt: skip
    return Outcome(index, "standard", "gw", status, 0.0, 1.0, ttft_s, 0.01,
                   status == 200, cancelled=cancelled)  # fmt: skip


def test_cancelled_requests_are_sent_but_neither_failed_nor_served() -> None:
    outcomes = [_outcome(0, 200, 0.1), _outcome(1, 200, 2.0), _outcome(2, 429),
                _outcome(3, 502), _outcome(4, 0, cancelled=True)]  # fmt: skip
    counts = PhaseResult("no control", 10.0, outcomes, 0, 0).counts(1.0, None)
    assert counts["sent"] == 5
    assert (counts["served"], counts["shed"], counts["failed"], counts["cancelled"]) == (2, 1, 1, 1)
    assert counts["good"] == 1 and counts["availability"] == 4 / 5


def test_the_comparison_shows_the_cancelled_row_and_names_a_real_failure_only() -> None:
    outcomes = [_outcome(0, 200, 0.1), _outcome(1, 0, cancelled=True)]
    lines = comparison([PhaseResult("no control", 10.0, outcomes, 0, 0)], 1.0, None, 0.9)
    row = next(line for line in lines if line.startswith("cancelled after the drain"))
    assert row.split()[-1] == "1"
    assert next(line for line in lines if line.startswith("failed")).split()[-1] == "0"
    assert not any(line.startswith("first failure") for line in lines)
