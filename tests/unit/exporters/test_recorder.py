"""RequestRecorder / RequestTrace and the sinks they hand records to."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporters.latency import request_latencies
from exporters.recorder import RequestRecorder
from exporters.records import Labels, Phase, RecordBatch, RequestRecord, Status, Vantage
from exporters.sinks import FanoutSink, InMemorySink, RecordSink

T0 = 5_000_000_000  # monotonic ns at the first start
WALL0 = 1_700_000_000_000_000_000


class FakeClock:
    """A monotonic ns clock the test moves by hand; ``wall`` keeps a fixed offset to it."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def wall(self) -> int:
        return WALL0 + (self.now - T0)

    def advance_us(self, us: int) -> None:
        self.now += us * 1000


def make(
    clock: FakeClock | None = None, **kwargs: object
) -> tuple[RequestRecorder, InMemorySink, FakeClock]:
    clock = clock or FakeClock()
    sink = InMemorySink()
    recorder = RequestRecorder(
        Vantage.GATEWAY,
        sink,
        clock_ns=clock,
        wall_clock_ns=clock.wall,
        **kwargs,  # type: ignore[arg-type]
    )
    return recorder, sink, clock


class RaisingSink:
    def __init__(self) -> None:
        self.calls = 0

    def export(self, record: RequestRecord) -> None:
        self.calls += 1
        raise RuntimeError("sink down")

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        raise RuntimeError("sink down")

    def shutdown(self, timeout_s: float = 10.0) -> None:
        raise RuntimeError("sink down")


def test_tokens_become_us_offsets_after_arrival_and_reach_the_sink() -> None:
    recorder, sink, clock = make()
    trace = recorder.start("r1", Labels(model="llama"))
    for gap_us in (120_000, 30_000, 35_000):
        clock.advance_us(gap_us)
        trace.token()
    clock.now += 999  # sub-µs remainder of the finish time is floored
    record = trace.finish()

    assert record.emission_offsets_us.tolist() == [120_000, 150_000, 185_000]
    assert record.emission_tokens is None
    assert record.output_tokens == 3
    assert record.status == Status.OK and record.final
    assert record.vantage == Vantage.GATEWAY
    assert record.labels == Labels(model="llama")
    assert record.arrival_time_ns == WALL0
    assert record.phase_offsets_us[Phase.FINISHED] == 185_000
    assert sink.records == [record]


def test_chunks_count_tokens_but_make_one_emission_each() -> None:
    recorder, _, clock = make()
    trace = recorder.start("r1")
    clock.advance_us(100)
    trace.tokens(3)
    clock.advance_us(100)
    trace.token()
    clock.advance_us(100)
    trace.tokens(0)  # a role/usage chunk: not an emission
    trace.tokens(2)
    record = trace.finish()

    assert record.emission_offsets_us.tolist() == [100, 200, 300]
    assert record.emission_tokens is not None
    assert record.emission_tokens.tolist() == [3, 1, 2]
    assert record.output_tokens == 6
    with pytest.raises(ValueError, match=r"tokens: k must be >= 0, got -1"):
        recorder.start("r2").tokens(-1)


def test_latencies_of_a_recorded_request_follow_the_metric_definitions() -> None:
    recorder, _, clock = make()
    trace = recorder.start("r1")
    clock.advance_us(200_000)
    trace.tokens(2)
    clock.advance_us(50_000)
    trace.token()
    batch = RecordBatch.from_records([trace.finish()])
    lat = request_latencies(batch)

    assert lat.ttft_s.tolist() == [0.2]
    assert lat.e2el_s.tolist() == [0.25]
    assert lat.tpot_s.tolist() == [0.025]  # (250 ms - 200 ms) / (3 - 1)
    assert lat.output_tokens.tolist() == [3]


def test_phases_are_recorded_as_us_offsets_and_finished_is_set_at_finish() -> None:
    recorder, _, clock = make()
    trace = recorder.start("r1")
    trace.mark(Phase.QUEUED)
    clock.advance_us(1_000)
    trace.mark(Phase.PREFILL_START)
    clock.advance_us(9_000)
    trace.mark(Phase.PREFILL_END, ts_ns=clock.now - 500_000)
    clock.advance_us(5_000)
    record = trace.finish()

    assert record.phase_offsets_us.tolist() == [0, 1_000, 9_500, -1, -1, 15_000]


def test_an_explicit_finished_mark_is_kept() -> None:
    recorder, _, clock = make()
    trace = recorder.start("r1")
    clock.advance_us(700)
    trace.mark(Phase.FINISHED)
    clock.advance_us(300)
    assert trace.finish().phase_offsets_us[Phase.FINISHED] == 700


@pytest.mark.parametrize(
    ("marks", "phase", "ts_delta_us", "message"),
    [
        (
            [],
            Phase.QUEUED,
            -1,
            r"mark\(QUEUED\): ts_ns 4999999000 is before the arrival at 5000000000",
        ),
        (
            [],
            Phase.QUEUED,
            10,
            r"mark\(QUEUED\): ts_ns 5000010000 is in the future \(now 5000000000\)",
        ),
        (
            [Phase.PREFILL_START],
            Phase.QUEUED,
            1,
            r"mark\(QUEUED\): ts_ns 5000001000 is out of order with PREFILL_START at 5000000000; "
            r"phases must be in time order \(QUEUED <= PREFILL_START <= PREFILL_END <= "
            r"KV_HANDOFF_START <= KV_HANDOFF_END <= FINISHED\)",
        ),
        (
            [Phase.PREFILL_END],
            Phase.PREFILL_START,
            1,
            r"mark\(PREFILL_START\): ts_ns 5000001000 is out of order with PREFILL_END",
        ),
    ],
)
def test_non_monotonic_marks_are_rejected(
    marks: list[Phase], phase: Phase, ts_delta_us: int, message: str
) -> None:
    recorder, _, clock = make()
    trace = recorder.start("r1")
    for m in marks:
        trace.mark(m)
    if ts_delta_us > 0 and marks:
        clock.advance_us(ts_delta_us)  # the mark is not in the future, only out of order
    with pytest.raises(ValueError, match=message):
        trace.mark(phase, ts_ns=T0 + ts_delta_us * 1000)
    assert trace.finish().phase_offsets_us[phase] == -1


def test_snapshot_is_a_partial_copy_of_the_state_so_far() -> None:
    recorder, sink, clock = make()
    trace = recorder.start("r1")
    clock.advance_us(10)
    trace.token()
    snap = trace.snapshot()
    clock.advance_us(10)
    trace.token()

    assert snap.final is False and snap.status == Status.IN_FLIGHT
    assert snap.emission_offsets_us.tolist() == [10]
    assert snap.phase_offsets_us[Phase.FINISHED] == -1
    assert sink.records == []  # a snapshot is not exported
    final = trace.finish()
    assert final.emission_offsets_us.tolist() == [10, 20]
    assert trace.snapshot() is final


def test_finish_is_idempotent_and_exports_once() -> None:
    recorder, sink, _ = make()
    trace = recorder.start("r1")
    first = trace.finish(Status.ERROR, "engine died")
    second = trace.finish(Status.OK)

    assert second is first
    assert (first.status, first.reason) == (Status.ERROR, "engine died")
    assert sink.records == [first]
    assert recorder.stats().num_finished == 1


def test_finish_rejects_in_flight() -> None:
    recorder, _, _ = make()
    with pytest.raises(ValueError, match="finish: status must be a final status, got IN_FLIGHT"):
        recorder.start("r1").finish(Status.IN_FLIGHT)


def test_buffer_grows_geometrically_and_keeps_every_token() -> None:
    recorder, _, clock = make(initial_capacity=4)
    trace = recorder.start("r1")
    for i in range(10):
        clock.advance_us(1)
        if i == 6:
            trace.tokens(4)
        else:
            trace.token()
    record = trace.finish()

    assert record.emission_offsets_us.tolist() == list(range(1, 11))
    assert record.emission_tokens is not None
    assert record.emission_tokens.tolist() == [1] * 6 + [4] + [1] * 3
    assert recorder.stats().num_buffer_growths == 2  # 4 -> 8 -> 16


def test_a_chunk_that_lands_on_a_full_buffer_grows_it() -> None:
    recorder, _, clock = make(initial_capacity=2)
    trace = recorder.start("r1")
    trace.token()
    trace.token()
    clock.advance_us(5)
    trace.tokens(3)
    record = trace.finish()
    assert record.emission_tokens is not None
    assert record.emission_tokens.tolist() == [1, 1, 3]
    assert record.emission_offsets_us.tolist() == [0, 0, 5]


def test_expected_tokens_sizes_the_buffer_so_it_never_grows() -> None:
    recorder, _, _ = make(initial_capacity=4)
    trace = recorder.start("r1", expected_tokens=100)
    for _ in range(100):
        trace.token()
    assert trace.finish().output_tokens == 100
    assert recorder.stats().num_buffer_growths == 0


def test_recycled_buffers_do_not_leak_previous_data() -> None:
    recorder, _, clock = make(initial_capacity=8)
    first = recorder.start("a")
    for _ in range(8):
        clock.advance_us(1_000)
        first.tokens(5)
    first.finish()

    second = recorder.start("b")
    clock.advance_us(7)
    second.token()
    record = second.finish()

    assert recorder.stats().num_buffers_reused == 1
    assert record.emission_offsets_us.tolist() == [7]
    assert record.emission_tokens is None  # the counts of "a" did not follow its buffer
    assert record.output_tokens == 1


def test_late_calls_after_finish_are_ignored_and_do_not_touch_a_reused_buffer() -> None:
    recorder, _, clock = make(initial_capacity=4)
    old = recorder.start("old")
    old.token()
    old_record = old.finish()
    new = recorder.start("new")  # takes the buffer "old" used
    clock.advance_us(3)
    old.token()
    old.tokens(2)
    old.mark(Phase.PREFILL_START)
    new.token()

    assert new.finish().emission_offsets_us.tolist() == [3]
    assert old.snapshot() is old_record
    assert old_record.output_tokens == 1
    assert recorder.stats().num_late_events == 3


def test_backdated_arrival_sets_wall_clock_arrival_and_offsets() -> None:
    recorder, _, clock = make()
    clock.advance_us(50)
    trace = recorder.start("r1", arrival_ts_ns=T0)
    trace.token()
    record = trace.finish()
    assert record.arrival_time_ns == WALL0
    assert record.emission_offsets_us.tolist() == [50]


def test_arrival_in_the_future_is_rejected() -> None:
    recorder, _, _ = make()
    with pytest.raises(ValueError, match="arrival_ts_ns must not be in the future of clock_ns"):
        recorder.start("r1", arrival_ts_ns=T0 + 1)


def test_set_counts_and_validation() -> None:
    recorder, _, _ = make()
    trace = recorder.start("r1")
    trace.set_counts(prompt_tokens=8000, cached_tokens=2048)
    trace.set_counts(kv_bytes=1 << 30)
    record = trace.finish()
    assert (record.prompt_tokens, record.cached_tokens, record.kv_bytes) == (8000, 2048, 1 << 30)
    with pytest.raises(ValueError, match="set_counts: kv_bytes must be >= 0, got -1"):
        recorder.start("r2").set_counts(kv_bytes=-1)


def test_partial_records_of_long_requests_only_once_per_interval() -> None:
    recorder, sink, clock = make(partial_interval_s=1.0)
    slow = recorder.start("slow")
    clock.advance_us(500_000)
    recorder.start("young")
    slow.token()
    done = recorder.start("done")
    clock.advance_us(500_000)
    done.finish()

    partials = recorder.partial_records()
    assert [r.request_id for r in partials] == ["slow"]
    assert partials[0].final is False and partials[0].status == Status.IN_FLIGHT
    assert partials[0].emission_offsets_us.tolist() == [500_000]
    assert recorder.partial_records() == []  # "slow" was just reported

    clock.advance_us(500_000)
    assert [r.request_id for r in recorder.partial_records()] == ["young"]
    assert [r.request_id for r in sink.records] == ["done"]  # partials are returned, not sent


def test_partial_records_needs_an_interval() -> None:
    recorder, _, _ = make()
    with pytest.raises(ValueError, match="partial_records: partial_interval_s is None"):
        recorder.partial_records()


def test_constructor_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="initial_capacity must be >= 1, got 0"):
        make(initial_capacity=0)
    with pytest.raises(ValueError, match="partial_interval_s must be > 0 or None, got 0"):
        make(partial_interval_s=0)


def test_a_raising_sink_never_reaches_the_request() -> None:
    sink = RaisingSink()
    recorder = RequestRecorder(Vantage.ENGINE, sink)
    recorder.start("r1").finish()
    recorder.start("r2").finish()
    stats = recorder.stats()
    assert (sink.calls, stats.num_sink_errors, stats.num_finished) == (2, 2, 2)


def test_stats_count_in_flight_requests() -> None:
    recorder, _, _ = make()
    a = recorder.start("a")
    recorder.start("b")
    a.finish()
    stats = recorder.stats()
    assert (stats.num_started, stats.num_finished, stats.num_in_flight) == (2, 1, 1)


def test_fanout_sends_to_every_sink_and_survives_a_broken_one() -> None:
    good_a, good_b, bad = InMemorySink(), InMemorySink(), RaisingSink()
    fanout = FanoutSink(good_a, bad, good_b)
    recorder = RequestRecorder(Vantage.GATEWAY, fanout)
    record = recorder.start("r1").finish()
    recorder.start("r2").finish()

    assert good_a.records[0] is record and good_b.records[0] is record
    assert len(good_a.records) == len(good_b.records) == 2
    assert fanout.force_flush(1.0) is False
    fanout.shutdown(1.0)
    fanout.shutdown(1.0)  # idempotent: the broken sink is not asked again
    assert fanout.num_errors == 2 + 1 + 1
    assert isinstance(fanout, RecordSink) and isinstance(good_a, RecordSink)


def test_in_memory_sink_drops_and_counts_after_shutdown() -> None:
    sink = InMemorySink()
    recorder = RequestRecorder(Vantage.GATEWAY, sink)
    recorder.start("r1").finish()
    sink.shutdown()
    recorder.start("r2").finish()
    assert [r.request_id for r in sink.records] == ["r1"]
    assert sink.num_dropped == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3_000_000), st.integers(1, 5)), min_size=0, max_size=40),
    st.integers(1, 8),
)
def test_any_emission_sequence_round_trips_exactly(
    emissions: list[tuple[int, int]], capacity: int
) -> None:
    recorder, _, clock = make(initial_capacity=capacity)
    trace = recorder.start("r1")
    times = []
    for gap_ns, k in emissions:
        clock.now += gap_ns
        times.append(clock.now)
        trace.tokens(k)
    record = trace.finish()

    expected = (np.array(times, dtype=np.int64) - T0) // 1000
    assert record.emission_offsets_us.tolist() == expected.tolist()
    assert record.output_tokens == sum(k for _, k in emissions)
    assert record.tokens_per_emission().tolist() == [k for _, k in emissions]
    RecordBatch.from_records([record]).validate()
