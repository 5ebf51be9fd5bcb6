"""De-duplication by (exporter_id, seq): verdicts, the sliding window, bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.ingest import Deduplicator, SeqVerdict


def applied(dedup: Deduplicator, exporter: str, seq: int) -> SeqVerdict:
    verdict = dedup.check(exporter, seq)
    if verdict is SeqVerdict.NEW:
        dedup.mark(exporter, seq)
    return verdict


def test_a_batch_is_new_once_then_a_duplicate() -> None:
    dedup = Deduplicator(window=8)
    assert applied(dedup, "gw-0", 0) is SeqVerdict.NEW
    assert applied(dedup, "gw-0", 0) is SeqVerdict.DUPLICATE
    assert applied(dedup, "gw-0", 1) is SeqVerdict.NEW
    assert dedup.high_water_mark("gw-0") == 1


def test_check_alone_changes_nothing() -> None:
    dedup = Deduplicator(window=8)
    assert dedup.check("gw-0", 3) is SeqVerdict.NEW
    assert dedup.check("gw-0", 3) is SeqVerdict.NEW
    assert dedup.high_water_mark("gw-0") is None


def test_exporters_are_independent() -> None:
    dedup = Deduplicator(window=8)
    applied(dedup, "a", 5)
    assert dedup.check("b", 5) is SeqVerdict.NEW
    assert dedup.check("a", 5) is SeqVerdict.DUPLICATE


def test_out_of_order_within_the_window_is_tracked_exactly() -> None:
    dedup = Deduplicator(window=8)
    for seq in (10, 7, 12, 9):
        assert applied(dedup, "x", seq) is SeqVerdict.NEW
    for seq in (10, 7, 12, 9):
        assert dedup.check("x", seq) is SeqVerdict.DUPLICATE
    for seq in (5, 6, 8, 11):
        assert dedup.check("x", seq) is SeqVerdict.NEW


def test_below_the_window_is_stale() -> None:
    dedup = Deduplicator(window=4)
    applied(dedup, "x", 10)
    assert dedup.check("x", 7) is SeqVerdict.NEW  # 10 - 7 = 3 < 4
    assert dedup.check("x", 6) is SeqVerdict.STALE
    assert dedup.check("x", 0) is SeqVerdict.STALE


def test_a_jump_beyond_the_window_forgets_everything_older() -> None:
    dedup = Deduplicator(window=4)
    applied(dedup, "x", 1)
    applied(dedup, "x", 2)
    applied(dedup, "x", 100)
    assert dedup.check("x", 99) is SeqVerdict.NEW
    assert dedup.check("x", 2) is SeqVerdict.STALE
    assert dedup.check("x", 100) is SeqVerdict.DUPLICATE


def test_least_recently_seen_exporter_is_evicted_at_the_bound() -> None:
    dedup = Deduplicator(window=4, max_exporters=2)
    applied(dedup, "a", 0)
    applied(dedup, "b", 0)
    applied(dedup, "a", 1)  # a is now the most recent
    applied(dedup, "c", 0)  # evicts b
    assert dedup.stats().num_exporters == 2
    assert dedup.stats().num_evicted == 1
    assert dedup.check("b", 0) is SeqVerdict.NEW  # forgotten: accepted again
    assert dedup.check("a", 1) is SeqVerdict.DUPLICATE


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "window must be an integer >= 1, got 0"),
        ({"window": True}, "window must be an integer >= 1, got True"),
        ({"max_exporters": 0}, "max_exporters must be an integer >= 1, got 0"),
    ],
)
def test_bounds_are_checked(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Deduplicator(**kwargs)


@given(
    window=st.integers(1, 64),
    seqs=st.lists(st.integers(0, 300), max_size=200),
)
def test_matches_a_set_of_applied_pairs_inside_the_window(window: int, seqs: list[int]) -> None:
    dedup = Deduplicator(window=window)
    seen: set[int] = set()
    high = -1
    for seq in seqs:
        verdict = applied(dedup, "x", seq)
        if high >= 0 and seq <= high - window:
            assert verdict is SeqVerdict.STALE
            continue
        assert verdict is (SeqVerdict.DUPLICATE if seq in seen else SeqVerdict.NEW)
        seen.add(seq)
        high = max(high, seq)
