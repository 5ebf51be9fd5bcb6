"""The paced replay: the rate ramp, record building, pacing by finish time, trace cycles."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from exporters.records import (
    Labels,
    Phase,
    RecordBatch,
    RequestRecord,
    Status,
    TokenDetail,
    Vantage,
)
from exporters.sinks import InMemorySink
from serving.replay.driver import (
    DEFAULT_MODEL,
    PRIORITIES,
    TENANTS,
    RampSchedule,
    ReplayDriver,
    build_record,
)
from serving.replay.latency_model import ModelParams, RequestTimings
from serving.traces import Trace

START_NS = 1_700_000_000_000_000_000


def small_trace(n: int = 40, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0.0, 4.0, n))
    arrival -= arrival[0]
    return Trace(arrival, rng.integers(10, 3000, n), rng.integers(1, 60, n), name="small")


# -- the rate schedule --


def test_the_ramp_rises_to_high_at_half_period_and_returns() -> None:
    ramp = RampSchedule(low=1.0, high=5.0, period_s=100.0)
    assert [ramp.scale_at(t) for t in (0.0, 25.0, 50.0, 75.0, 100.0, 125.0)] == pytest.approx(
        [1.0, 3.0, 5.0, 3.0, 1.0, 3.0]
    )


def test_trace_time_integrates_the_scale() -> None:
    ramp = RampSchedule(low=1.0, high=5.0, period_s=100.0)
    # Half a period at a mean scale of 3, then a whole period at 3 too.
    assert ramp.trace_time(np.array([50.0, 150.0])).tolist() == pytest.approx([150.0, 450.0])
    constant = RampSchedule(low=2.0, high=2.0, period_s=10.0)
    assert constant.trace_time(np.array([0.0, 7.0, 33.0])).tolist() == pytest.approx(
        [0.0, 14.0, 66.0]
    )


@pytest.mark.parametrize(
    "ramp", [RampSchedule(), RampSchedule(0.5, 3.0, 7.0), RampSchedule(2.0, 2.0, 30.0)]
)
def test_wall_time_inverts_trace_time(ramp: RampSchedule) -> None:
    wall = np.linspace(0.0, 5 * ramp.period_s, 2001)
    trace = ramp.trace_time(wall)
    assert (np.diff(trace) > 0).all()
    np.testing.assert_allclose(ramp.wall_time(trace), wall, rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"low": 0.0}, r"low must be a finite number > 0, got 0.0"),
        ({"period_s": float("inf")}, r"period_s must be a finite number > 0, got inf"),
        ({"low": 3.0, "high": 2.0}, r"high must be >= low \(3.0\), got 2.0"),
    ],
)
def test_the_ramp_names_a_bad_field(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RampSchedule(**kwargs)


# -- records --


def test_a_record_carries_the_modelled_times_as_the_gateway_saw_them() -> None:
    timings = RequestTimings(
        index=3,
        arrival_s=2.0,
        prefill_start_s=2.01,
        prefill_end_s=2.05,
        kv_end_s=2.0525,
        emission_s=np.array([2.0525, 2.0625, 2.0725]),
    )
    record = build_record(
        timings,
        request_id="r-3",
        start_time_ns=START_NS,
        labels=Labels(model="m", tenant="acme", priority="batch"),
        prompt_tokens=1000,
        kv_bytes=1000 * 131_072,
    )
    assert record.arrival_time_ns == START_NS + 2_000_000_000
    assert record.emission_offsets_us.tolist() == [52_500, 62_500, 72_500]
    assert record.phase_offsets_us.tolist() == [0, 10_000, 50_000, 50_000, 52_500, 72_500]
    assert record.phase_offsets_us[Phase.FINISHED] == 72_500
    assert (record.vantage, record.token_detail, record.status) == (
        Vantage.GATEWAY,
        TokenDetail.FULL,
        Status.OK,
    )
    assert (record.prompt_tokens, record.kv_bytes, record.output_tokens) == (1000, 131_072_000, 3)
    RecordBatch.from_records([record]).validate()


# -- pacing --


def driver(trace: Trace, sink: InMemorySink, seed: int = 0) -> ReplayDriver:
    return ReplayDriver(
        trace,
        sink,
        schedule=RampSchedule(low=1.0, high=3.0, period_s=8.0),
        params=ModelParams(),
        seed=seed,
        start_time_ns=START_NS,
        run_id="test",
    )


def finish_ns(record: RequestRecord) -> int:
    return record.arrival_time_ns + int(record.emission_offsets_us[-1]) * 1000


def test_records_leave_once_each_and_never_before_their_finish_time() -> None:
    trace, sink = small_trace(), InMemorySink()
    replay = driver(trace, sink)
    seen = 0
    for now_s in np.arange(0.0, 3.0, 0.05).tolist():
        replay.poll(now_s)
        fresh = sink.records[seen:]
        seen += len(fresh)
        assert all(finish_ns(r) <= START_NS + round(now_s * 1e9) for r in fresh)
    ids = [r.request_id for r in sink.records]
    assert len(ids) == len(set(ids)) > 0
    stats = replay.stats()
    assert stats.num_exported == len(ids)
    assert stats.num_arrived == stats.num_exported + stats.num_in_flight
    assert stats.elapsed_s == pytest.approx(2.95)


def test_arrivals_follow_the_schedule() -> None:
    trace, sink = small_trace(), InMemorySink()
    replay = driver(trace, sink)
    replay.poll(1.5)
    expected = int((replay.schedule.wall_time(trace.arrival_s) <= 1.5).sum())
    assert replay.stats().num_arrived == expected
    assert replay.stats().rate_scale == pytest.approx(1.75)


def test_records_carry_model_tenant_and_priority_labels() -> None:
    trace, sink = small_trace(200), InMemorySink()
    replay = driver(trace, sink)
    replay.poll(60.0)
    records = sink.records
    assert {r.labels.model for r in records} == {DEFAULT_MODEL}
    assert {r.labels.tenant for r in records} == {name for name, _ in TENANTS}
    assert {r.labels.priority for r in records} == {name for name, _ in PRIORITIES}
    for r in records:
        assert r.vantage == Vantage.GATEWAY and r.token_detail == TokenDetail.FULL
        assert r.request_id.startswith("test-")
    RecordBatch.from_records(records).validate()


def test_the_trace_repeats_for_as_long_as_the_replay_runs() -> None:
    trace, sink = small_trace(10), InMemorySink()
    replay = driver(trace, sink)
    replay.poll(30.0)
    # At scale >= 1, 30 s of wall time covers more than 30 s of a ~4 s trace.
    assert replay.stats().num_arrived >= 10 * 7
    arrivals = [r.arrival_time_ns for r in sorted(sink.records, key=lambda r: r.request_id)]
    assert arrivals == sorted(arrivals)
    assert {r.prompt_tokens for r in sink.records} <= set(trace.input_tokens.tolist())


def test_the_same_seed_replays_the_same_records() -> None:
    def replay(seed: int) -> list[tuple[str, str, list[int]]]:
        sink = InMemorySink()
        d = driver(small_trace(), sink, seed=seed)
        for now_s in np.arange(0.0, 20.0, 0.1).tolist():
            d.poll(now_s)
        return [
            (r.request_id, r.labels.tenant, r.emission_offsets_us.tolist()) for r in sink.records
        ]

    assert replay(4) == replay(4)
    assert replay(4) != replay(5)


def test_run_stops_at_the_duration_with_a_fake_clock() -> None:
    trace, sink = small_trace(), InMemorySink()
    replay = driver(trace, sink)
    ticks = iter(np.arange(0.0, 100.0, 0.25).tolist())
    stats = replay.run(threading.Event(), duration_s=5.0, tick_s=0.0, clock=lambda: next(ticks))
    assert stats.elapsed_s == 5.0
    assert stats.num_exported == len(sink.records) > 0


def test_run_returns_when_stopped() -> None:
    stop = threading.Event()
    stop.set()
    stats = driver(small_trace(), InMemorySink()).run(stop, tick_s=0.0)
    assert stats.num_arrived == 0


def test_an_empty_trace_is_refused_with_its_name() -> None:
    empty = Trace(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), name="nothing")
    with pytest.raises(ValueError, match=r"trace 'nothing' has no requests to replay"):
        ReplayDriver(empty, InMemorySink())
