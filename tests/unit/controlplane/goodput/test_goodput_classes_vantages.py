"""Rejections per priority class and latency percentiles per vantage: the per-class counts
are exact and sum to the SLO's ``rejected`` over every window; the other vantage's
percentiles are those an SLO defined there would measure."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.api.routes.goodput_series import series
from controlplane.goodput import GoodputEngine, MinuteRollup
from controlplane.goodput._slo_state import MAX_CLASSES, OTHER_CLASS
from exporters.records import Labels, RecordBatch, RequestRecord, Status, Vantage
from tests.unit.controlplane.goodput.fixtures import (
    T0,
    FakeClock,
    finish_second,
    make_record,
    make_spec,
)

US = 1_000_000
NOW = T0 + 5000
WINDOWS: list[str | float] = ["10s", "1m", "5m", "1h", "1d", "compliance", 7.0, 1800.0, 7200.0]
CLASSES = [f"class-{k}" for k in range(MAX_CLASSES + 3)] + [""]


@st.composite
def traffic(draw: st.DrawFn) -> list[list[RequestRecord]]:
    """1-3 batches of records finishing over the last ~1.4 h, both vantages, some rejected
    in up to 12 priority classes (more than an SLO counts apart)."""
    classes = draw(st.lists(st.sampled_from(CLASSES), min_size=1, max_size=12, unique=True))
    batches = []
    for b in range(draw(st.integers(1, 3))):
        batch = []
        for i in range(draw(st.integers(1, 25))):
            status = draw(st.sampled_from([Status.OK, Status.REJECTED, Status.ERROR]))
            batch.append(
                make_record(
                    f"b{b}r{i}",
                    (NOW - draw(st.integers(0, 5000))) * US - draw(st.integers(0, US - 1)),
                    ttft_us=-1 if status is Status.REJECTED else draw(st.integers(1, 900_000)),
                    status=status,
                    labels=Labels(
                        model=draw(st.sampled_from(["m", "n"])),
                        priority=draw(st.sampled_from(classes)),
                    ),
                    vantage=draw(st.sampled_from(list(Vantage))),
                )
            )
        batches.append(batch)
    return batches


def _engine(*specs: object, other_vantage: bool = True) -> GoodputEngine:
    engine = GoodputEngine(clock=FakeClock(NOW), other_vantage=other_vantage)
    engine.set_slos(specs)  # type: ignore[arg-type]
    return engine


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=traffic())
def test_rejections_per_class_are_exact_and_sum_to_rejected(
    batches: list[list[RequestRecord]],
) -> None:
    spec = make_spec(selector={"model": "m"}, window_s=3 * 86400)
    engine = _engine(spec)
    for batch in batches:
        engine.ingest(RecordBatch.from_records(batch))
    chosen = [
        r
        for batch in batches
        for r in batch
        if r.status is Status.REJECTED and r.vantage is Vantage.GATEWAY and r.labels.model == "m"
    ]
    for window in WINDOWS:
        by_class = engine.rejected_by_class(spec.id, window)
        stats = engine.query(spec.id, window, percentiles=False)
        assert sum(by_class.values()) == stats.rejected, window
    # Over a window holding every record (1 d, 1-s detail lost only for the slots): exact.
    exact = Counter(r.labels.priority for r in chosen)
    by_class = engine.rejected_by_class(spec.id, "1d")
    assert len(by_class) <= MAX_CLASSES
    assert set(by_class) <= set(exact) | {OTHER_CLASS}
    if len(exact) <= MAX_CLASSES:
        assert by_class == dict(exact)
    else:
        named = {c: n for c, n in by_class.items() if c != OTHER_CLASS}
        assert named == {c: exact[c] for c in named}
        assert by_class[OTHER_CLASS] == sum(exact.values()) - sum(named.values())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=traffic(), vantage=st.sampled_from(list(Vantage)))
def test_the_other_vantage_has_the_percentiles_of_an_slo_defined_there(
    batches: list[list[RequestRecord]], vantage: Vantage
) -> None:
    other = Vantage.ENGINE if vantage is Vantage.GATEWAY else Vantage.GATEWAY
    spec = make_spec(slo_id="here", selector={"model": "m"}, vantage=vantage)
    there = make_spec(slo_id="there", selector={"model": "m"}, vantage=other)
    engine = _engine(spec, there)
    for batch in batches:
        engine.ingest(RecordBatch.from_records(batch))
    for window in WINDOWS:
        per_vantage = engine.vantage_percentiles(spec.id, window)
        own, theirs = engine.query(spec.id, window), engine.query(there.id, window)
        name, other_name = vantage.name.lower(), other.name.lower()
        for metric in ("ttft", "tpot", "itl", "e2el"):
            assert per_vantage[name][metric] == getattr(own, metric), (window, metric)
            assert per_vantage[other_name][metric] == getattr(theirs, metric), (window, metric)


def test_without_other_vantage_sketches_the_other_vantage_is_empty() -> None:
    spec = make_spec()
    engine = _engine(spec, other_vantage=False)
    records = [
        make_record(f"r{k}", (NOW - 5) * US, vantage=v) for k, v in enumerate([*Vantage] * 3)
    ]
    engine.ingest(RecordBatch.from_records(records))
    per_vantage = engine.vantage_percentiles(spec.id, "1m")
    assert per_vantage["gateway"]["ttft"].p50_s == pytest.approx(0.1, rel=0.01)
    assert all(p.p50_s is None for p in per_vantage["engine"].values())


def test_a_vantage_change_swaps_own_and_other_sketches() -> None:
    spec = make_spec()
    engine = _engine(spec)
    records = [
        make_record("g", (NOW - 5) * US, ttft_us=100_000, vantage=Vantage.GATEWAY),
        make_record("e", (NOW - 5) * US, ttft_us=40_000, vantage=Vantage.ENGINE),
    ]
    engine.ingest(RecordBatch.from_records(records))
    before = engine.vantage_percentiles(spec.id, "1m")
    engine.set_slos([make_spec(vantage=Vantage.ENGINE)])
    after = engine.vantage_percentiles(spec.id, "1m")
    assert after == before
    assert engine.query(spec.id, "1m").ttft.p50_s == pytest.approx(0.04, rel=0.01)


def test_class_counters_exist_only_once_an_slo_rejects() -> None:
    shed, calm = (
        make_spec(slo_id="shed", selector={"model": "m"}),
        make_spec(slo_id="calm", selector={"model": "n"}),
    )
    engine = _engine(shed, calm)
    engine.ingest(RecordBatch.from_records([make_record("ok", (NOW - 5) * US)]))
    before = engine.memory_bytes()["slos"]
    assert engine.rejected_by_class(shed.id, "1m") == {}
    rejected = make_record(
        "no",
        (NOW - 5) * US,
        ttft_us=-1,
        status=Status.REJECTED,
        labels=Labels(model="m", priority="sheddable"),
    )
    engine.ingest(RecordBatch.from_records([rejected]))
    assert engine.rejected_by_class(shed.id, "1m") == {"sheddable": 1}
    assert engine.rejected_by_class(calm.id, "1m") == {}
    # One class: 8 bytes a slot of each counter tier (1 s, 1 min, 1 h) and its slot number.
    assert engine.memory_bytes()["slos"] - before < 150_000


def test_rejections_restored_from_rollups_stored_without_classes_have_no_class() -> None:
    spec = make_spec()
    engine = _engine(spec)
    minute = (NOW - 600) // 60 * 60
    rollup = MinuteRollup(
        slo_id=spec.id,
        minute_start=datetime.fromtimestamp(minute, tz=UTC),
        requests=0,
        good=0,
        errors=0,
        aborted=0,
        rejected=3,
        output_tokens=0,
        good_output_tokens=0,
        violations={},
        sketch_blob=b"",
    )
    assert engine.load_rollups([rollup]) == 1
    assert engine.query(spec.id, "1h").rejected == 3
    assert engine.rejected_by_class(spec.id, "1h") == {}


def test_series_has_rejections_per_class_and_percentiles_per_vantage() -> None:
    spec = make_spec(selector={"model": "m"})
    engine = _engine(spec)
    records = []
    for k in range(40):
        second = NOW - 1 - k * 7
        records.append(make_record(f"g{k}", second * US, labels=Labels(model="m")))
        records.append(
            make_record(f"e{k}", second * US, ttft_us=30_000, vantage=Vantage.ENGINE,
                        labels=Labels(model="m"))
        )  # fmt: skip
        records.append(
            make_record(f"x{k}", second * US, ttft_us=-1, status=Status.REJECTED,
                        labels=Labels(model="m", priority="batch" if k % 3 else ""))
        )  # fmt: skip
    engine.ingest(RecordBatch.from_records(records))
    out = series(engine, spec.id, 300.0, NOW)
    columns, by_class = out["columns"], out["rejected_by_class"]
    assert set(by_class) == {"batch", ""}
    totals = [sum(values) for values in zip(*by_class.values(), strict=True)]
    assert totals == columns["rejected"]
    assert sum(by_class["batch"]) + sum(by_class[""]) == sum(
        1 for r in records if r.status is Status.REJECTED and NOW - 300 < finish_second(r) <= NOW
    )
    gateway, engine_side = (
        out["percentiles_by_vantage"]["gateway"],
        out["percentiles_by_vantage"]["engine"],
    )
    for name in ("ttft_p50_s", "ttft_p99_s", "e2el_p99_s"):
        assert gateway[name] == columns[name]
        assert len(engine_side[name]) == len(columns["time"])
    drawn = [v for v in engine_side["ttft_p50_s"] if v is not None]
    assert drawn and all(v == pytest.approx(0.03, rel=0.01) for v in drawn)
