"""Dry runs: candidate objectives judged over the stored recent requests, against the
offline exact computation; the store's cap and the errors it reports."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.goodput import GoodputEngine, SpecError
from exporters.records import Labels, RecordBatch, Status, TokenDetail, Vantage
from exporters.slo import Metric, Objective
from tests.unit.controlplane.goodput.fixtures import (
    T0,
    FakeClock,
    assert_close_quantile,
    finish_ns,
    finish_second,
    make_record,
    make_spec,
    offline,
)

US = 1_000_000


def recent_traffic(n: int = 300, seed: int = 1) -> list:
    rng = np.random.default_rng(seed)
    statuses = [Status.OK] * 8 + [Status.ERROR, Status.ABORTED, Status.REJECTED]
    return [
        make_record(
            f"r{i}",
            (T0 + 100) * US + int(rng.integers(0, 1200 * US)),
            ttft_us=int(rng.integers(10_000, 500_000)),
            gaps_us=rng.integers(1_000, 80_000, size=int(rng.integers(0, 12))).tolist(),
            status=statuses[int(rng.integers(0, len(statuses)))],
            labels=Labels(model="m", tenant=str(rng.choice(["a", "b"]))),
            vantage=Vantage(int(rng.integers(0, 2))),
            detail=TokenDetail(int(rng.random() < 0.25)),  # some ITL not carried (SUMMARY)
        )
        for i in range(n)
    ]


def loaded_engine(records, **kwargs) -> tuple[GoodputEngine, FakeClock]:
    clock = FakeClock(T0 + 1300)
    engine = GoodputEngine(clock=clock, **kwargs)
    engine.set_slos([make_spec()])
    for part in np.array_split(np.arange(len(records)), 5):
        engine.ingest(RecordBatch.from_records([records[i] for i in part]))
    return engine, clock


@pytest.mark.parametrize(
    "objectives",
    [
        [Objective(Metric.TTFT, 0.25)],
        [Objective(Metric.TTFT, 0.3), Objective(Metric.ITL, 0.05)],
        [Objective(Metric.ITL, 0.04, "p99"), Objective(Metric.TPOT, 0.03)],
        [Objective(Metric.ITL, 0.03, "p50"), Objective(Metric.E2EL, 0.6)],
        [],
    ],
)
def test_dry_run_equals_the_offline_judgement_of_the_candidate(objectives) -> None:
    records = recent_traffic()
    engine, clock = loaded_engine(records)
    candidate = make_spec(objectives, slo_id="candidate", selector={"tenant": "a"}, target=0.95)
    stats = engine.dry_run(candidate, 3600)
    exact = offline(candidate, records)
    got = (stats.requests, stats.good, stats.errors, stats.aborted, stats.rejected)
    assert got == (exact.requests, exact.good, exact.errors, exact.aborted, exact.rejected)
    assert (stats.output_tokens, stats.good_output_tokens) == (
        exact.output_tokens,
        exact.good_output_tokens,
    )
    assert dict(stats.violations) == exact.violations
    assert dict(stats.measured) == exact.measured
    assert stats.attainment_ratio == pytest.approx(exact.good / exact.requests)
    # History (and so the rate's divisor) begins with the earliest finish accepted.
    assert stats.duration_s == clock.now - min(finish_second(r) for r in records)
    assert_close_quantile(stats.ttft.p99_s, exact.ttft, 0.99)
    assert_close_quantile(stats.e2el.p50_s, exact.e2el, 0.5)
    assert stats.itl.p50_s is None  # gaps are not stored


def test_dry_run_of_the_live_spec_matches_the_live_window() -> None:
    records = recent_traffic(seed=2)
    engine, _ = loaded_engine(records)
    live, dry = engine.query("s1", "1h"), engine.dry_run(make_spec(), 3600)
    for field in ("requests", "good", "errors", "aborted", "rejected", "output_tokens"):
        assert getattr(dry, field) == getattr(live, field)
    assert dry.violations == live.violations
    assert dry.measured == live.measured


def test_a_shorter_window_keeps_only_recent_finishes() -> None:
    records = recent_traffic(seed=4)
    engine, clock = loaded_engine(records)
    stats = engine.dry_run(make_spec(), 200.0)
    exact = offline(make_spec(), [r for r in records if finish_ns(r) / 1e9 > clock.now - 200])
    assert 0 < exact.requests < 100
    assert (stats.requests, stats.good, stats.aborted) == (
        exact.requests,
        exact.good,
        exact.aborted,
    )
    assert stats.duration_s == 200.0


def test_the_cap_evicts_the_oldest_rows_and_counts_them() -> None:
    records = sorted(recent_traffic(2000, seed=5), key=lambda r: r.arrival_time_ns)
    engine, _ = loaded_engine(records, recent_rows_cap=1000)
    health = engine.health()
    assert health.recent_rows <= 1000
    assert health.recent_evicted == 2000 - health.recent_rows
    stats = engine.dry_run(make_spec(), 3600)
    assert stats.requests + stats.aborted + stats.rejected < 2000
    assert stats.duration_s < 1300.0  # rates divide by the span still covered


def test_unstored_itl_percentiles_and_bad_windows_are_refused() -> None:
    engine, _ = loaded_engine(recent_traffic(10))
    with pytest.raises(
        SpecError,
        match=r"itl statistic 'p75' cannot be judged here; allowed: "
        r"\['max', 'p50', 'p90', 'p95', 'p99'\]",
    ):
        engine.dry_run(make_spec([Objective(Metric.ITL, 0.05, "p75")]), 600)
    with pytest.raises(SpecError, match=r"window_s must be in \(0, 3600\] for a dry run, got 7200"):
        engine.dry_run(make_spec(), 7200)


def test_a_selector_value_never_seen_selects_nothing() -> None:
    engine, _ = loaded_engine(recent_traffic(10))
    stats = engine.dry_run(make_spec(selector={"tenant": "nobody"}), 600)
    assert (stats.requests, stats.attainment_ratio) == (0, None)
