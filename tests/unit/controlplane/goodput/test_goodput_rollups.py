"""Minute rollups: emitted once when complete, re-emitted when a late record changes them,
and loaded back into a fresh engine with the same long-window statistics."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import numpy as np
import pytest

from controlplane.goodput import GoodputEngine, MinuteRollup, SpecError, rollup_sketches
from exporters.records import RecordBatch, Status, TokenDetail
from exporters.slo import Metric, Objective
from tests.unit.controlplane.goodput.fixtures import T0, FakeClock, make_record, make_spec

US = 1_000_000
SPEC = make_spec(
    [Objective(Metric.TTFT, 0.2), Objective(Metric.ITL, 0.03, "p99")], window_s=7 * 86400
)


def minute(m: int) -> datetime:
    return datetime.fromtimestamp(T0 + 60 * m, tz=UTC)


def test_complete_minutes_are_emitted_once_with_their_counts() -> None:
    clock = FakeClock(T0 + 30)
    engine = GoodputEngine(clock=clock)
    engine.set_slos([SPEC])
    engine.ingest(
        RecordBatch.from_records(
            [
                make_record("a", (T0 + 10) * US, ttft_us=100_000, gaps_us=[10_000, 20_000]),
                make_record("b", (T0 + 20) * US, ttft_us=300_000, gaps_us=[50_000]),
                make_record("c", (T0 + 25) * US, status=Status.ABORTED),
                make_record("d", (T0 + 29) * US, ttft_us=-1, status=Status.REJECTED),
                # A stat-logger record: no gaps carried, so its ITL p99 is not measured.
                make_record("e", (T0 + 27) * US, gaps_us=[40_000], detail=TokenDetail.SUMMARY),
            ]
        )
    )
    assert engine.rollups(T0 + 59.9) == []  # the minute is not complete yet
    (rollup,) = engine.rollups(T0 + 60)
    assert rollup == MinuteRollup(
        slo_id="s1",
        minute_start=minute(0),
        requests=3,
        good=2,
        errors=0,
        aborted=1,
        rejected=1,
        output_tokens=3 + 2 + 3 + 2,
        good_output_tokens=3 + 2,
        violations={"ttft": 1, "itl_p99": 1},
        sketch_blob=rollup.sketch_blob,
        unmeasured={"ttft": 0, "itl_p99": 1},
        rejected_by_class={"": 1},  # the rejection carries no priority label
        other_sketch_blob=b"",  # nothing seen at the other vantage
        vantage="gateway",
    )
    sketches = rollup_sketches(rollup.sketch_blob)
    assert {name: s.count for name, s in sketches.items()} == {
        "ttft": 3,
        "tpot": 3,
        "itl": 3,
        "e2el": 3,
    }
    assert sketches["ttft"].quantile(1.0) == pytest.approx(0.3, rel=0.01)
    assert engine.rollups(T0 + 600) == []


def test_a_late_record_re_emits_its_minute_with_full_counts() -> None:
    clock = FakeClock(T0 + 50)
    engine = GoodputEngine(clock=clock)
    engine.set_slos([SPEC])
    engine.ingest(RecordBatch.from_records([make_record("a", (T0 + 10) * US)]))
    assert [r.requests for r in engine.rollups(T0 + 60)] == [1]
    clock.now = T0 + 200
    engine.ingest(
        RecordBatch.from_records(
            [make_record("late", (T0 + 40) * US), make_record("now", (T0 + 130) * US)]
        )
    )
    emitted = engine.rollups(clock.now)
    assert [(r.minute_start, r.requests) for r in emitted] == [(minute(0), 2), (minute(2), 1)]
    again = engine.reemit_rollups(T0, T0 + 180)
    assert again == emitted
    assert engine.reemit_rollups(T0 + 60, T0 + 120) == []  # minute 1 holds no request


def test_loading_rollups_restores_the_long_window_statistics() -> None:
    rng = np.random.default_rng(3)
    clock = FakeClock(T0)
    before = GoodputEngine(clock=clock)
    before.set_slos([SPEC])
    rollups: list[MinuteRollup] = []
    for m in range(150):
        clock.now = T0 + 60 * m + 59
        records = [
            make_record(
                f"{m}-{i}",
                (T0 + 60 * m) * US + int(rng.integers(0, 59 * US)),
                ttft_us=int(rng.integers(10_000, 400_000)),
                gaps_us=rng.integers(1_000, 60_000, size=int(rng.integers(0, 8))).tolist(),
                status=Status.OK if rng.random() < 0.9 else Status.ERROR,
                detail=TokenDetail.SUMMARY if rng.random() < 0.3 else TokenDetail.FULL,
            )
            for i in range(int(rng.integers(0, 6)))
        ]
        before.ingest(RecordBatch.from_records(records))
        rollups += before.rollups(clock.now)  # the flusher's job, once a minute
    clock.now = T0 + 150 * 60 + 59.5  # every window below starts on a minute boundary
    rollups += before.rollups(clock.now)
    assert len(rollups) > 100
    assert sum(r.unmeasured["itl_p99"] for r in rollups) > 0
    assert before.health().rollups_without_sketches == 0

    after = GoodputEngine(clock=clock)
    after.set_slos([SPEC, make_spec(slo_id="other")])
    assert after.load_rollups(rollups) == len(rollups)
    for window in ("5m", "1h", 7200.0, "1d", "compliance"):
        want, got = before.query("s1", window), after.query("s1", window)
        assert got.as_dict() | {"ttft": None, "tpot": None, "itl": None, "e2el": None} == (
            want.as_dict() | {"ttft": None, "tpot": None, "itl": None, "e2el": None}
        )
        if window != "5m":  # 10-s sketch slots split minutes; minute-or-coarser ones do not
            assert (got.ttft, got.tpot, got.itl, got.e2el) == (
                want.ttft,
                want.tpot,
                want.itl,
                want.e2el,
            )
    assert after.query("other", "compliance").requests == 0


def test_load_skips_unknown_slos_and_rejects_naive_times() -> None:
    engine = GoodputEngine(clock=FakeClock(T0 + 3600))
    engine.set_slos([SPEC])
    rollup = MinuteRollup(
        slo_id="gone",
        minute_start=minute(1),
        requests=1,
        good=1,
        errors=0,
        aborted=0,
        rejected=0,
        output_tokens=5,
        good_output_tokens=5,
        violations={},
        sketch_blob=b"",
    )
    assert engine.load_rollups([rollup]) == 0
    naive = dataclasses.replace(rollup, slo_id="s1", minute_start=datetime(2023, 1, 1))
    with pytest.raises(SpecError, match="minute_start must be timezone-aware"):
        engine.load_rollups([naive])


def test_minutes_collected_too_late_are_emitted_with_counts_only_and_counted() -> None:
    clock = FakeClock(T0 + 30)
    engine = GoodputEngine(clock=clock)
    engine.set_slos([SPEC])
    engine.ingest(RecordBatch.from_records([make_record("a", (T0 + 10) * US)]))
    clock.now = T0 + 124 * 60 + 30  # minute 124 reuses minute 0's sketch slot
    engine.ingest(RecordBatch.from_records([make_record("b", int((clock.now - 1) * US))]))
    old, _current = engine.rollups(clock.now + 60)
    assert old.requests == 1
    assert all(s.count == 0 for s in rollup_sketches(old.sketch_blob).values())
    assert engine.health().rollups_without_sketches == 1
