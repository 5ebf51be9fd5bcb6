"""What ingest shares between SLOs changes nothing: sketches and histograms count every
value exactly, and SLOs that select the same rows count as if each were alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.goodput import GoodputEngine, SLOSpec, _sketch_adds, rollup_sketches
from controlplane.goodput._batch import METRICS, PROM_OF_CODE, gap_codes
from exporters import buckets
from exporters.records import (
    Labels,
    RecordBatch,
    RecordError,
    RequestRecord,
    Status,
    TokenDetail,
    Vantage,
)
from exporters.sketch import LatencySketch
from exporters.slo import Metric, Objective
from tests.unit.controlplane.goodput.fixtures import T0, FakeClock, make_record, make_spec, offline

US = 1_000_000
NOW = T0 + 1300
# Gaps on and around Prometheus bounds (10 ms, 2.5 ms), the code table's end (2**20 µs)
# and far beyond it, with ordinary ones.
gap_values = st.integers(0, 90_000) | st.sampled_from(
    [0, 1, 2_499, 2_500, 2_501, 9_999, 10_000, 10_001, 1_048_575, 1_048_576, 3_000_000]
)


@st.composite
def records(draw: st.DrawFn) -> list[RequestRecord]:
    out = []
    for i in range(draw(st.integers(1, 30))):
        gaps = draw(st.lists(gap_values, max_size=8))
        out.append(
            make_record(
                f"r{i}",
                (T0 + 1000) * US + draw(st.integers(0, 250 * US)),
                ttft_us=draw(st.integers(-1, 400_000)),
                gaps_us=gaps,
                status=draw(st.sampled_from([Status.OK, Status.OK, Status.ERROR, Status.ABORTED])),
                labels=Labels(model="m", tenant=draw(st.sampled_from(["a", "b"]))),
                vantage=draw(st.sampled_from([Vantage.GATEWAY, Vantage.GATEWAY, Vantage.ENGINE])),
                final=draw(st.booleans() | st.just(True)),
                detail=draw(
                    st.sampled_from([TokenDetail.FULL, TokenDetail.FULL, TokenDetail.SUMMARY])
                ),
            )
        )
    return out


def specs() -> list[SLOSpec]:
    """Three SLOs over the same rows (two selectors and none), one over a subset, one on
    the other vantage; ITL objectives of several statistics."""
    return [
        make_spec([Objective(Metric.TTFT, 0.2)], slo_id="all"),
        make_spec(
            [Objective(Metric.ITL, 0.02, "p99"), Objective(Metric.TPOT, 0.03)],
            slo_id="model",
            selector={"model": "m"},
        ),
        make_spec([Objective(Metric.ITL, 0.05)], slo_id="same", selector={"model": "m"}),
        make_spec(
            [Objective(Metric.ITL, 0.01, "p50"), Objective(Metric.E2EL, 0.5)],
            slo_id="tenant-a",
            selector={"tenant": "a"},
        ),
        make_spec([Objective(Metric.TTFT, 0.1)], slo_id="engine", vantage=Vantage.ENGINE),
    ]


def ingest_all(engine: GoodputEngine, recs: list[RequestRecord], cuts: list[int]) -> None:
    for lo, hi in zip([0, *cuts], [*cuts, len(recs)], strict=True):
        if hi > lo:
            engine.ingest(RecordBatch.from_records(recs[lo:hi]))


def sketch_totals(engine: GoodputEngine, slo_id: str) -> dict[str, np.ndarray]:
    """Per metric, the sum of the sketches of every minute rollup of ``slo_id``."""
    totals = {name: np.zeros(LatencySketch.NUM_BUCKETS, dtype=np.int64) for name in METRICS}
    for rollup in engine.reemit_rollups(T0, NOW + 120):
        if rollup.slo_id == slo_id:
            for name, sketch in rollup_sketches(rollup.sketch_blob).items():
                totals[name] += sketch.counts
    return totals


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records(), st.lists(st.integers(0, 30), max_size=3).map(sorted))
def test_every_value_lands_in_its_exact_sketch_and_prometheus_bucket(recs, cuts) -> None:
    engine = GoodputEngine(clock=FakeClock(NOW))
    engine.set_slos(specs())
    ingest_all(engine, recs, cuts)
    totals = {t.slo_id: t for t in engine.totals()}
    for spec in specs():
        exact = offline(spec, recs)
        sketches = sketch_totals(engine, spec.id)
        for name in METRICS:
            values = np.asarray(getattr(exact, name), dtype=np.float64)
            np.testing.assert_array_equal(sketches[name], LatencySketch.bucket_counts(values))
            histogram = totals[spec.id].histograms[name]
            want = np.bincount(
                buckets.bucket_index(values), minlength=len(buckets.LATENCY_BUCKETS_S) + 1
            )
            assert list(histogram.bucket_counts) == want.tolist(), (spec.id, name)
            assert math.isclose(histogram.sum_s, float(values.sum()), rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records(), st.lists(st.integers(0, 30), max_size=3).map(sorted))
def test_slos_sharing_rows_count_as_if_each_were_alone(recs, cuts) -> None:
    together = GoodputEngine(clock=FakeClock(NOW))
    together.set_slos(specs())
    ingest_all(together, recs, cuts)
    for spec in specs():
        alone = GoodputEngine(clock=FakeClock(NOW))
        alone.set_slos([spec])
        ingest_all(alone, recs, cuts)
        (want,) = alone.totals()
        got = next(t for t in together.totals() if t.slo_id == spec.id)
        assert got == want
        for window in ("10s", "1m", "5m", "1h"):
            assert together.query(spec.id, window) == alone.query(spec.id, window)
        for name, counts in sketch_totals(together, spec.id).items():
            np.testing.assert_array_equal(counts, sketch_totals(alone, spec.id)[name])


@given(st.lists(gap_values | st.integers(0, 10**10), min_size=1, max_size=100))
def test_a_gap_code_holds_its_sketch_and_prometheus_buckets(values) -> None:
    gaps_us = np.asarray(values, dtype=np.int64)
    codes = gap_codes(gaps_us)
    seconds = gaps_us / 1e6
    np.testing.assert_array_equal(codes // 2, LatencySketch.bucket_index(seconds))
    np.testing.assert_array_equal(PROM_OF_CODE[codes], buckets.bucket_index(seconds))


def test_counting_in_chunks_of_groups_changes_nothing(monkeypatch) -> None:
    """A backlog (records finishing over an hour) is counted in chunks of 10-s slots when
    the dense layout would be large; forcing tiny chunks gives the same state."""
    rng = np.random.default_rng(11)
    recs = [
        make_record(
            f"r{i}",
            int((NOW - rng.uniform(0, 3600)) * US),
            ttft_us=int(rng.integers(1_000, 900_000)),
            gaps_us=rng.integers(0, 200_000, size=int(rng.integers(0, 40))).tolist(),
            labels=Labels(model="m", tenant=str(rng.choice(["a", "b"]))),
        )
        for i in range(400)
    ]

    def state(budget: int) -> tuple[list, list, dict]:
        monkeypatch.setattr(_sketch_adds, "_DENSE_BUDGET", budget)
        engine = GoodputEngine(clock=FakeClock(NOW))
        engine.set_slos(specs())
        ingest_all(engine, recs, [150, 151, 390])
        sketches = {spec.id: sketch_totals(engine, spec.id) for spec in specs()}
        return engine.totals(), [engine.query(s.id, "1h") for s in specs()], sketches

    whole, small = state(1 << 20), state(1)
    assert whole[0] == small[0]
    assert whole[1] == small[1]
    for slo_id, metrics in whole[2].items():
        for name, counts in metrics.items():
            np.testing.assert_array_equal(counts, small[2][slo_id][name])
    assert sum(t.good + t.bad for t in whole[0]) > 0


def test_an_unvalidated_negative_gap_is_refused_not_looked_up() -> None:
    engine = GoodputEngine(clock=FakeClock(NOW), itl_percentiles=())
    engine.set_slos([make_spec()])
    rec = make_record("bad", (T0 + 1000) * US, gaps_us=[5_000, 5_000])
    rec.emission_offsets_us = rec.emission_offsets_us[[0, 2, 1]].copy()
    with pytest.raises(RecordError) as err:
        engine.ingest(RecordBatch.from_records([rec]), validate=False)
    assert str(err.value) == "emission_offsets_us: negative ITL gap -5000 µs; validate the batch"
    assert engine.health().records == 0
