"""The live engine against the offline exact computation: counts, ratios, percentiles,
windows, ring wrap-around, late and future records, in-flight updates, SLO set changes."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.goodput import GoodputEngine, SpecError, UnknownSLOError
from controlplane.goodput import engine as engine_module
from exporters.records import Labels, RecordBatch, RequestRecord, Status, TokenDetail, Vantage
from exporters.slo import Metric, Objective
from tests.unit.controlplane.goodput.fixtures import (
    T0,
    FakeClock,
    assert_close_quantile,
    finish_second,
    make_record,
    make_spec,
    offline,
)

US = 1_000_000


def engine_with(*specs, now: float = T0) -> tuple[GoodputEngine, FakeClock]:
    clock = FakeClock(now)
    engine = GoodputEngine(clock=clock)
    engine.set_slos(specs or [make_spec()])
    return engine, clock


def test_hand_made_requests_give_every_count_and_ratio() -> None:
    engine, clock = engine_with(make_spec(target=0.9))
    at = (T0 + 30) * US
    records = [
        make_record("good", at, ttft_us=150_000, gaps_us=[10_000, 10_000]),
        make_record("slow", at, ttft_us=250_000, gaps_us=[10_000]),
        make_record("edge", at, ttft_us=200_000, gaps_us=[]),  # inclusive threshold: good
        make_record("err", at, ttft_us=300_000, gaps_us=[5_000], status=Status.ERROR),
        make_record("gone", at, ttft_us=100_000, gaps_us=[5_000], status=Status.ABORTED),
        make_record("shed", at, ttft_us=-1, status=Status.REJECTED),
        make_record("busy", at, ttft_us=100_000, final=False, status=Status.IN_FLIGHT),
    ]
    engine.ingest(RecordBatch.from_records(records))
    clock.now = T0 + 60.5
    stats = engine.query("s1", "1m")

    assert (stats.requests, stats.good, stats.bad, stats.errors) == (4, 2, 2, 1)
    assert (stats.aborted, stats.admitted, stats.rejected) == (1, 5, 1)
    assert stats.violations == {"ttft": 2}  # "slow" and the failed "err"
    assert stats.output_tokens == 3 + 2 + 1 + 2 + 2
    assert stats.good_output_tokens == 3 + 1
    assert stats.duration_s == 60.0
    assert stats.goodput_rps == pytest.approx(2 / 60)
    assert stats.throughput_rps == pytest.approx(5 / 60)
    assert stats.attainment_ratio == pytest.approx(0.5)
    assert stats.burn_rate == pytest.approx(0.5 / 0.1)
    assert stats.availability_ratio == pytest.approx(5 / 6)
    assert stats.error_budget_remaining_ratio == pytest.approx(1 - 0.5 / 0.1)
    assert stats.in_flight == 1
    assert stats.ttft.p50_s == pytest.approx(0.2, rel=0.01)
    assert stats.itl.p99_s == pytest.approx(0.01, rel=0.01)


def test_nothing_judged_gives_none_ratios_and_a_full_budget() -> None:
    engine, _ = engine_with()
    stats = engine.query("s1", "5m", now=T0 + 10)
    assert stats.requests == 0
    assert stats.attainment_ratio is None and stats.burn_rate is None
    assert stats.availability_ratio is None
    assert stats.error_budget_remaining_ratio == 1.0
    assert stats.ttft.p99_s is None
    assert stats.duration_s == 10.0


def test_rates_divide_by_elapsed_time_until_the_window_is_full() -> None:
    engine, clock = engine_with()
    engine.ingest(RecordBatch.from_records([make_record("a", (T0 + 5) * US)]))
    clock.now = T0 + 20
    assert engine.query("s1", "5m").duration_s == 20.0
    assert engine.query("s1", "10s").duration_s == 10.0
    clock.now = T0 + 0.2
    assert engine.query("s1", "1m").duration_s == 1.0  # never below one second


def test_percentiles_are_within_the_sketch_error_of_exact_values() -> None:
    rng = np.random.default_rng(7)
    engine, clock = engine_with(make_spec(), now=T0 + 260)
    records = []
    for i in range(400):
        gaps = rng.integers(1_000, 120_000, size=int(rng.integers(0, 30))).tolist()
        finish = (T0 + 100) * US + int(rng.integers(0, 150 * US))
        records.append(
            make_record(f"r{i}", finish, ttft_us=int(rng.integers(1, 3 * US)), gaps_us=gaps)
        )
    for part in np.array_split(np.arange(400), 7):
        engine.ingest(RecordBatch.from_records([records[i] for i in part]))
    clock.now = T0 + 299
    stats = engine.query("s1", "5m")
    exact = offline(make_spec(), records)
    for name in ("ttft", "tpot", "itl", "e2el"):
        got = getattr(stats, name)
        values = getattr(exact, name)
        assert_close_quantile(got.p50_s, values, 0.5)
        assert_close_quantile(got.p90_s, values, 0.9)
        assert_close_quantile(got.p99_s, values, 0.99)


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[RequestRecord], list[Objective], list[int]]:
    n = draw(st.integers(1, 40))
    records = []
    for i in range(n):
        num_gaps = draw(st.integers(0, 5))
        gaps = draw(st.lists(st.integers(0, 90_000), min_size=num_gaps, max_size=num_gaps))
        records.append(
            make_record(
                f"r{i}",
                (T0 + 1000) * US + draw(st.integers(0, 200 * US)),
                ttft_us=draw(st.integers(-1, 400_000)),
                gaps_us=gaps,
                status=draw(
                    st.sampled_from(
                        [Status.OK, Status.OK, Status.ERROR, Status.ABORTED, Status.REJECTED]
                    )
                ),
                labels=Labels(model="m", tenant=draw(st.sampled_from(["a", "b"]))),
                vantage=draw(st.sampled_from(list(Vantage))),
                final=draw(st.booleans() | st.just(True)),
                detail=draw(st.sampled_from(list(TokenDetail))),
            )
        )
    threshold = st.integers(1, 300_000).map(lambda us: us / US)
    objectives = [Objective(Metric.TTFT, draw(threshold))]
    if draw(st.booleans()):
        objectives.append(
            Objective(Metric.ITL, draw(threshold), draw(st.sampled_from(["max", "p50", "p99"])))
        )
    if draw(st.booleans()):
        objectives.append(Objective(Metric.TPOT, draw(threshold)))
    if draw(st.booleans()):
        objectives.append(Objective(Metric.E2EL, draw(threshold)))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=3)))
    return records, objectives, cuts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario(), st.sampled_from([{}, {"tenant": "a"}]))
def test_engine_equals_offline_exact_computation(case, selector) -> None:
    records, objectives, cuts = case
    spec = make_spec(objectives, selector=selector)
    engine, clock = engine_with(spec, now=T0 + 1200)
    for lo, hi in zip([0, *cuts], [*cuts, len(records)], strict=True):
        engine.ingest(RecordBatch.from_records(records[lo:hi]))
    clock.now = T0 + 1250.5
    now_s = T0 + 1250
    for window in ("5m", "1m", "10s"):
        stats = engine.query("s1", window)
        w = {"5m": 300, "1m": 60, "10s": 10}[window]
        inside = [r for r in records if now_s - w < finish_second(r) <= now_s]
        exact = offline(spec, inside)
        got = (stats.requests, stats.good, stats.errors, stats.aborted, stats.rejected)
        assert got == (exact.requests, exact.good, exact.errors, exact.aborted, exact.rejected)
        assert stats.output_tokens == exact.output_tokens
        assert stats.good_output_tokens == exact.good_output_tokens
        assert dict(stats.violations) == exact.violations
        assert dict(stats.measured) == exact.measured
        expected = exact.good / exact.requests if exact.requests else None
        assert stats.attainment_ratio == pytest.approx(expected)
    # Sketch windows cover whole 10-s slots: the 5 min one holds every record here.
    stats = engine.query("s1", "5m")
    exact = offline(spec, records)
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert_close_quantile(getattr(stats, name).p90_s, getattr(exact, name), 0.9)


def test_windows_count_whole_seconds_ending_with_the_current_one() -> None:
    engine, clock = engine_with(now=T0 + 119)
    seconds = [T0 + 100, T0 + 109, T0 + 110, T0 + 118, T0 + 119]
    engine.ingest(
        RecordBatch.from_records([make_record(f"r{s}", s * US + 500_000) for s in seconds])
    )
    clock.now = T0 + 119.9
    assert engine.query("s1", "10s").requests == 3  # seconds 110 … 119
    assert engine.query("s1", 20.0).requests == 5
    assert engine.query("s1", 1.0).requests == 1


def test_the_one_second_ring_wraps_and_long_windows_keep_the_rest() -> None:
    engine, clock = engine_with(make_spec(window_s=7 * 86400))
    # One request a minute for 3 h, ingested as time goes by (never late).
    for minute in range(180):
        clock.now = T0 + minute * 60 + 30
        engine.ingest(
            RecordBatch.from_records([make_record(f"m{minute}", (T0 + minute * 60 + 30) * US)])
        )
    clock.now = T0 + 180 * 60 - 0.5
    assert engine.query("s1", "1h").requests == 60
    assert engine.query("s1", "5m").requests == 5
    assert engine.query("s1", "1d").requests == 180
    assert engine.query("s1", "compliance").requests == 180
    assert engine.query("s1", 7200.0).requests == 120
    assert engine.health().late == 0
    # A day later the 1-s ring positions were all reused: nothing old leaks in.
    clock.now = T0 + 86400 + 11_000
    engine.ingest(RecordBatch.from_records([make_record("new", int((clock.now - 1) * US))]))
    assert engine.query("s1", "1h").requests == 1
    assert engine.query("s1", "1d").requests == 1
    assert engine.query("s1", "compliance").requests == 181


def test_late_records_go_to_coarse_buckets_and_too_old_or_future_ones_are_dropped() -> None:
    engine, clock = engine_with(now=T0 + 4 * 3600)
    now = clock.now
    records = [
        make_record("late", int((now - 1.5 * 3600) * US)),
        make_record("too-old", int((now - 3 * 3600) * US)),
        make_record("ahead", int((now + 120) * US)),
        make_record("fine", int((now - 5) * US)),
        make_record("soon", int((now + 30) * US)),
    ]
    engine.ingest(RecordBatch.from_records(records))
    health = engine.health()
    assert (health.late, health.dropped_late, health.dropped_future) == (1, 1, 1)
    assert (health.records, health.final) == (5, 5)
    assert engine.query("s1", "1h").requests == 1  # "fine"; "soon" is not due yet
    # The 1-minute slots hold "late" and, already, "soon" (it ends in the current minute).
    assert engine.query("s1", "1d").requests == 3
    clock.now = now + 31
    assert engine.query("s1", "1m").requests == 2


def test_a_partial_record_is_in_flight_until_its_final_record() -> None:
    engine, clock = engine_with()
    at = (T0 + 10) * US
    partial = make_record("r1", at, final=False, status=Status.IN_FLIGHT)
    engine.ingest(RecordBatch.from_records([partial, make_record("r2", at, final=False)]))
    clock.now = T0 + 11
    stats = engine.query("s1", "1m")
    assert (stats.in_flight, stats.requests) == (2, 0)
    engine.ingest(RecordBatch.from_records([make_record("r1", at + 500_000)]))
    stats = engine.query("s1", "1m")
    assert (stats.in_flight, stats.requests) == (1, 1)
    assert engine.health().in_flight_updates == 2
    clock.now = T0 + 11 + 601
    assert engine.query("s1", "1m").in_flight == 0  # r2's final never came


def test_selectors_and_vantage_choose_rows() -> None:
    gateway_a = make_spec(slo_id="a", selector={"tenant": "a"})
    engine_side = make_spec(slo_id="e", vantage=Vantage.ENGINE)
    everything = make_spec(slo_id="all")
    engine, clock = engine_with(gateway_a, engine_side, everything)
    at = (T0 + 5) * US
    engine.ingest(
        RecordBatch.from_records(
            [
                make_record("1", at, labels=Labels(tenant="a")),
                make_record("2", at, labels=Labels(tenant="b")),
                make_record("3", at, labels=Labels(tenant="a"), vantage=Vantage.ENGINE),
                make_record("4", at, labels=Labels(tenant="zzz")),
            ]
        )
    )
    clock.now = T0 + 6
    assert [s.requests for s in engine.summary()] == [1, 1, 3]
    assert [s.slo_id for s in engine.summary(window="5m")] == ["a", "e", "all"]


def test_changed_spec_keeps_history_and_judges_new_requests_with_the_new_objectives() -> None:
    old = make_spec([Objective(Metric.TTFT, 0.2), Objective(Metric.ITL, 1.0)])
    engine, clock = engine_with(old)
    engine.ingest(RecordBatch.from_records([make_record("a", (T0 + 1) * US, ttft_us=300_000)]))
    summary = make_record("s", (T0 + 1) * US, detail=TokenDetail.SUMMARY)  # ITL not carried
    engine.ingest(RecordBatch.from_records([summary]))
    new = make_spec(
        [Objective(Metric.TTFT, 0.5), Objective(Metric.ITL, 0.05, "p99"), Objective(Metric.ITL, 1)],
        window_s=86400,
    )
    engine.set_slos([new])
    engine.ingest(RecordBatch.from_records([make_record("b", (T0 + 2) * US, ttft_us=300_000)]))
    clock.now = T0 + 3
    stats = engine.query("s1", "1m")
    assert (stats.requests, stats.good) == (3, 2)  # "a" stays bad: judged under the old spec
    assert stats.violations == {"ttft": 1, "itl_p99": 0, "itl": 0}
    # The kept key keeps its unmeasured count ("s"). A new key counts from the change, as
    # its violations do: earlier requests were judged without it (measured, not violated).
    assert stats.measured == {"ttft": 3, "itl_p99": 3, "itl": 2}
    assert stats.measured_ratio == {"ttft": 1.0, "itl_p99": 1.0, "itl": 2 / 3}
    assert engine.query("s1", "compliance").window_s == 86400
    assert engine.slos == [new]


def test_new_ids_start_empty_and_removed_ids_are_gone() -> None:
    engine, clock = engine_with(make_spec(slo_id="x"))
    engine.ingest(RecordBatch.from_records([make_record("a", (T0 + 1) * US)]))
    engine.set_slos([make_spec(slo_id="y")])
    clock.now = T0 + 2
    assert engine.query("y", "1m").requests == 0
    with pytest.raises(UnknownSLOError, match="slo_id: no SLO 'x'; known: \\['y'\\]"):
        engine.query("x", "1m")
    engine.set_slos([make_spec(slo_id="x")])
    assert engine.query("x", "1m").requests == 0


def test_bad_arguments_name_the_field_and_what_is_allowed() -> None:
    engine, _ = engine_with(make_spec(window_s=3600))
    with pytest.raises(
        SpecError,
        match=r"window: unknown name '2h'; allowed: "
        r"\['10s', '1m', '5m', '1h', '1d', 'compliance'\] or seconds",
    ):
        engine.query("s1", "2h")
    with pytest.raises(
        SpecError, match=r"window must be in \(0, 86400\] seconds for SLO 's1', got 90000.0"
    ):
        engine.query("s1", 90_000.0)
    with pytest.raises(SpecError, match="id: 's1' appears twice"):
        engine.set_slos([make_spec(), make_spec()])


def test_error_budget_uses_the_compliance_window() -> None:
    engine, clock = engine_with(make_spec(target=0.75, window_s=600))
    recs = [make_record(f"g{i}", (T0 + 10) * US) for i in range(3)]
    recs.append(make_record("bad", (T0 + 10) * US, ttft_us=900_000))
    engine.ingest(RecordBatch.from_records(recs))
    clock.now = T0 + 100
    stats = engine.query("s1", "10s")
    assert stats.requests == 0
    assert stats.error_budget_remaining_ratio == pytest.approx(1 - 0.25 / 0.25)
    assert engine.query("s1", "compliance").burn_rate == pytest.approx(1.0)


def test_an_invalid_batch_is_rejected_with_the_metric_core_error() -> None:
    engine, _ = engine_with()
    rec = make_record("bad", (T0 + 1) * US)
    rec.emission_offsets_us = rec.emission_offsets_us[::-1].copy()
    with pytest.raises(ValueError, match="non-monotonic token times in request 'bad'"):
        engine.ingest(RecordBatch.from_records([rec]))
    assert engine.health().records == 0


def test_a_batch_the_engine_fails_on_is_not_half_applied(monkeypatch) -> None:
    engine, clock = engine_with(make_spec(slo_id="a"), make_spec(slo_id="b"))
    good = RecordBatch.from_records([make_record("r1", (T0 + 1) * US)])
    engine.ingest(good)
    before = engine.totals()

    def broken(*args: object) -> None:
        raise RuntimeError("sketches failed")

    monkeypatch.setattr(engine_module, "sketch_adds", broken)
    with pytest.raises(RuntimeError, match="sketches failed"):
        engine.ingest(RecordBatch.from_records([make_record("r2", (T0 + 2) * US)]))
    assert engine.totals() == before  # counters of neither SLO moved
    clock.now = T0 + 3
    assert engine.query("a", "1m").requests == engine.query("b", "1m").requests == 1


def test_summary_of_many_slos_is_cheap_and_complete() -> None:
    specs = [make_spec(slo_id=f"s{i}", selector={"tenant": f"t{i % 5}"}) for i in range(20)]
    engine, clock = engine_with(*specs)
    recs = [
        make_record(f"r{i}", (T0 + 1) * US, labels=Labels(tenant=f"t{i % 5}")) for i in range(50)
    ]
    engine.ingest(RecordBatch.from_records(recs))
    clock.now = T0 + 2
    summary = engine.summary()
    assert [s.requests for s in summary] == [10] * 20
    assert all(math.isclose(s.attainment_ratio or 0, 1.0) for s in summary)


def test_empty_partial_only_and_tokenless_batches() -> None:
    engine, _ = engine_with()
    engine.ingest(RecordBatch.empty())
    engine.ingest(RecordBatch.from_records([make_record("p", (T0 - 1) * US, final=False)]))
    engine.ingest(
        RecordBatch.from_records(
            [make_record("t", (T0 - 1) * US, ttft_us=-1, detail=TokenDetail.SUMMARY)]
        )
    )
    stats = engine.query("s1", "1m")
    assert (stats.requests, stats.good, stats.in_flight, stats.output_tokens) == (1, 1, 1, 0)
    assert stats.ttft.p50_s is None  # no token: TTFT undefined, not in the sketch
    assert stats.e2el.p50_s == pytest.approx(0.05, rel=0.01)  # FINISHED phase
    assert engine.health().records == 2


def test_query_if_free_answers_as_query_and_never_waits_for_the_lock() -> None:
    engine, _ = engine_with()
    assert engine.query_if_free("s1", "1m") == engine.query("s1", "1m")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # a batch being counted in another thread
        with engine._lock:
            held.set()
            release.wait(5)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        held.wait(5)
        assert engine.query_if_free("s1", "1m") is None
    finally:
        release.set()
        thread.join()
    assert engine.query_if_free("s1", "1m") is not None
