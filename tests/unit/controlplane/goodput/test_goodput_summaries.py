"""The engine's whole-fleet reads for the console's overview: ``summaries`` (several
windows in one pass) equals ``summary`` per window, and ``good_per_minute`` counts the
good requests of each minute from the minute counters."""

from __future__ import annotations

from controlplane.goodput import GoodputEngine
from exporters.records import Labels, RecordBatch, Status
from tests.unit.controlplane.goodput.fixtures import T0, FakeClock, make_record, make_spec

US = 1_000_000
WINDOWS = {"5m": 300.0, "1h": 3600.0, "6h": 21600.0, "compliance": "compliance"}


def _engine() -> tuple[GoodputEngine, FakeClock]:
    clock = FakeClock(T0)
    engine = GoodputEngine(clock=clock)
    engine.set_slos(
        [
            make_spec(slo_id="a", selector={"model": "a"}, window_s=86400),
            make_spec(slo_id="b", selector={"model": "b"}, target=0.99),
        ]
    )
    records = []
    for k in range(180):  # three minutes of traffic, one request a second per SLO
        for model in ("a", "b"):
            bad = model == "b" and k % 3 == 0
            records.append(
                make_record(
                    f"{model}{k}",
                    (T0 + k) * US,
                    labels=Labels(model=model),
                    status=Status.ERROR if bad else Status.OK,
                )
            )
    clock.now = T0 + 185.0
    engine.ingest(RecordBatch.from_records(records))
    return engine, clock


def test_summaries_equal_one_summary_per_window() -> None:
    engine, clock = _engine()
    together = engine.summaries(WINDOWS)
    for name, window in WINDOWS.items():
        assert together[name] == engine.summary(clock.now, window, percentiles=False), name


def test_good_per_minute_counts_each_minute() -> None:
    engine, _ = _engine()
    first = T0 // 60
    counts = engine.good_per_minute(first - 1, first + 3)
    minute_of = [(T0 + k) // 60 for k in range(180)]
    expected_a = [minute_of.count(m) for m in range(first - 1, first + 4)]
    expected_b = [
        sum(1 for k in range(180) if minute_of[k] == m and k % 3 != 0)
        for m in range(first - 1, first + 4)
    ]
    assert counts == {"a": expected_a, "b": expected_b}
    assert engine.good_per_minute(first - 2000, first - 1999) == {"a": [0, 0], "b": [0, 0]}
