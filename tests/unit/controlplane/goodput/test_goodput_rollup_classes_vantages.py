"""Rejections per priority class and the other vantage's sketches in the minute rollups: an
engine that loads another's rollups answers the same per-class counts and per-vantage
percentiles over every window of whole minutes, and an SLO seen at one vantage that
rejects nothing stores nothing more."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.goodput import GoodputEngine, MinuteRollup, rollup_sketches
from controlplane.goodput._slo_state import MAX_CLASSES
from exporters.records import Labels, RecordBatch, RequestRecord, Status, Vantage
from tests.unit.controlplane.goodput.fixtures import FakeClock, make_record, make_spec
from tests.unit.controlplane.goodput.test_goodput_classes_vantages import NOW, US, traffic

# Windows read from rings of a minute or coarser (a restored minute has lost its per-second
# detail: the 1-s counters, which answer windows up to 1 h, hold it at its first second).
COUNT_WINDOWS: list[str | float] = ["1d", "compliance", 5000.0, 7200.0]
SKETCH_WINDOWS: list[str | float] = ["1h", 1800.0, *COUNT_WINDOWS]


def _engine(*specs: object) -> GoodputEngine:
    engine = GoodputEngine(clock=FakeClock(NOW), other_vantage=True)
    engine.set_slos(specs)  # type: ignore[arg-type]
    return engine


def _restarted(rollups: list[MinuteRollup], *specs: object) -> GoodputEngine:
    """A new engine with the SLOs of ``specs`` and the minutes ``rollups``."""
    restored = _engine(*specs)
    restored.load_rollups(rollups)
    return restored


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=traffic(), vantage=st.sampled_from(list(Vantage)))
def test_restored_rollups_answer_the_same_classes_and_vantage_percentiles(
    batches: list[list[RequestRecord]], vantage: Vantage
) -> None:
    spec = make_spec(selector={"model": "m"}, vantage=vantage, window_s=3 * 86400)
    engine = _engine(spec)
    for batch in batches:
        engine.ingest(RecordBatch.from_records(batch))
    restored = _restarted(engine.rollups(NOW + 60), spec)
    classes = {
        r.labels.priority
        for batch in batches
        for r in batch
        if r.status is Status.REJECTED and r.vantage is vantage and r.labels.model == "m"
    }
    for window in COUNT_WINDOWS:
        before = engine.rejected_by_class(spec.id, window)
        after = restored.rejected_by_class(spec.id, window)
        if len(classes) <= MAX_CLASSES:
            assert after == before, window
        else:  # which classes share "other" follows the order they were first seen in
            assert sum(after.values()) == sum(before.values()), window
        assert restored.query(spec.id, window).rejected == engine.query(spec.id, window).rejected
    for window in SKETCH_WINDOWS:
        assert restored.vantage_percentiles(spec.id, window) == engine.vantage_percentiles(
            spec.id, window
        ), window


def test_an_slo_seen_at_one_vantage_that_rejects_nothing_stores_nothing_more() -> None:
    spec = make_spec()
    engine = _engine(spec)
    engine.ingest(RecordBatch.from_records([make_record("g", (NOW - 5) * US)]))
    (rollup,) = engine.rollups(NOW + 60)
    assert rollup.rejected_by_class == {}
    assert rollup.other_sketch_blob == b""
    assert rollup.vantage == "gateway"


def test_a_minute_seen_at_the_other_vantage_only_is_rolled_up() -> None:
    spec = make_spec()
    engine = _engine(spec)
    engine.ingest(
        RecordBatch.from_records(
            [make_record("e", (NOW - 5) * US, ttft_us=40_000, vantage=Vantage.ENGINE)]
        )
    )
    (rollup,) = engine.rollups(NOW + 60)
    assert rollup.requests == 0
    assert rollup_sketches(rollup.other_sketch_blob)["ttft"].count == 1
    restored = _restarted([rollup], spec)
    assert restored.vantage_percentiles(spec.id, "1h") == engine.vantage_percentiles(spec.id, "1h")


def test_rollups_written_before_a_vantage_change_restore_each_vantage_its_own() -> None:
    spec = make_spec()
    engine = _engine(spec)
    records = [
        make_record("g", (NOW - 5) * US, ttft_us=100_000, vantage=Vantage.GATEWAY),
        make_record("e", (NOW - 5) * US, ttft_us=40_000, vantage=Vantage.ENGINE),
        make_record(
            "r",
            (NOW - 5) * US,
            ttft_us=-1,
            status=Status.REJECTED,
            labels=Labels(model="m", priority="batch"),
        ),
    ]
    engine.ingest(RecordBatch.from_records(records))
    rollups = engine.rollups(NOW + 60)
    moved = make_spec(vantage=Vantage.ENGINE)
    engine.set_slos([moved])
    restored = _restarted(rollups, moved)
    assert restored.vantage_percentiles(spec.id, "1h") == engine.vantage_percentiles(spec.id, "1h")
    assert restored.rejected_by_class(spec.id, "1h") == {"batch": 1}
