"""Building blocks: SLOSpec validation, the rings, the judge variant, the sketch blob."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.goodput import SLOSpec, SpecError, objective_key, rollup_sketches
from controlplane.goodput._batch import prom_index
from controlplane.goodput._blob import decode_sketch_blob, encode_sketch_blob
from controlplane.goodput._judge import judge_values
from controlplane.goodput._rings import CounterRing, SketchRing
from exporters.buckets import LATENCY_BUCKETS_S, bucket_index
from exporters.latency import ItlGroups, request_latencies
from exporters.records import RecordBatch, Status, Vantage
from exporters.sketch import LatencySketch, SketchError
from exporters.slo import Metric, Objective, judge
from tests.unit.controlplane.goodput.fixtures import T0, make_record, make_spec

NB = LatencySketch.NUM_BUCKETS


# -- SLOSpec ------------------------------------------------------------------------------


def test_objective_keys() -> None:
    assert objective_key(Objective(Metric.TTFT, 0.2)) == "ttft"
    assert objective_key(Objective(Metric.ITL, 0.05)) == "itl"
    assert objective_key(Objective(Metric.ITL, 0.05, "p99.9")) == "itl_p99.9"
    spec = make_spec([Objective(Metric.E2EL, 9), Objective(Metric.ITL, 0.1, "p90")])
    assert spec.objective_keys == ("e2el", "itl_p90")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target": 1.0}, "target must be in (0, 1), got 1.0"),
        ({"window_s": 0.5}, "window_s must be a finite number of seconds >= 1, got 0.5"),
        ({"selector": {"user": "x"}}, "selector: unknown label 'user'; allowed: ['model',"),
        ({"availability_target": 2.0}, "availability_target must be in (0, 1), got 2.0"),
        ({"objectives": ("ttft",)}, "objectives[0] must be an Objective, got 'ttft'"),
        (
            {"objectives": (Objective(Metric.TTFT, 0.1), Objective(Metric.TTFT, 0.2))},
            "objectives: two objectives share the key 'ttft'",
        ),
        ({"vantage": "client"}, "vantage must be one of ['gateway', 'engine'], got 'client'"),
        ({"id": ""}, "id must be a non-empty string, got ''"),
    ],
)
def test_spec_errors_name_the_field(kwargs, message) -> None:
    base = {"id": "x", "name": "x", "objectives": (), "target": 0.9, "window_s": 60.0}
    with pytest.raises(SpecError) as info:
        SLOSpec(**{**base, **kwargs})
    assert str(info.value).startswith(message)


def test_spec_accepts_vantage_names_and_lists() -> None:
    spec = SLOSpec(
        id="x", name="x", objectives=[Objective(Metric.TTFT, 1)], target=0.5, window_s=60,
        vantage="engine",
    )  # fmt: skip
    assert spec.vantage is Vantage.ENGINE
    assert isinstance(spec.objectives, tuple)


# -- rings --------------------------------------------------------------------------------


def test_counter_ring_wraps_and_never_reads_a_stale_slot() -> None:
    ring = CounterRing(resolution_s=1, size=4, width=2)
    ring.add(np.array([10, 11]), np.array([[1, 2], [3, 4]]))
    assert ring.total(10, 13).tolist() == [4, 6]
    ring.add(np.array([14]), np.array([[5, 5]]))  # reuses slot 10's position
    assert ring.total(10, 14).tolist() == [8, 9]
    assert ring.get(10) is None
    assert ring.total(0, 9).tolist() == [0, 0]
    assert ring.held_slots().tolist() == [11, 14]
    smaller = ring.resized(1)
    assert smaller.held_slots().tolist() == [14]
    remapped = ring.remapped([1, None, 0])
    assert remapped.get(11).tolist() == [4, 0, 3]


def test_sketch_ring_spans_merge_and_sum_to_dense_counts() -> None:
    rng = np.random.default_rng(0)
    ring = SketchRing(resolution_s=10, size=3, num_metrics=2)
    dense = np.zeros((2, NB), dtype=np.int64)
    for _ in range(30):
        metric = int(rng.integers(0, 2))
        lo = int(rng.integers(0, NB - 50))
        counts = rng.integers(0, 5, size=int(rng.integers(1, 50)))
        ring.add(7, metric, lo, counts)
        dense[metric, lo : lo + counts.shape[0]] += counts
    assert np.array_equal(ring.get(7), dense)
    assert np.array_equal(ring.total(0, 100), dense)
    ring.add(10, 0, 5, np.array([1]))  # slot 10 takes slot 7's position
    assert ring.get(7) is None
    assert ring.total(0, 100)[0].sum() == 1
    assert np.array_equal(ring.resized(1).get(10), ring.get(10))


# -- judge variant ------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-1, 300_000),
            st.lists(st.integers(0, 60_000), max_size=6),
            st.sampled_from(list(Status)),
        ),
        max_size=15,
    ),
    st.lists(st.sampled_from(["max", "p50", "p90", "p99"]), min_size=1, max_size=3, unique=True),
    st.integers(1, 70_000),
)
def test_judge_values_equals_judge_on_the_token_times(rows, statistics, threshold_us) -> None:
    records = [
        make_record(f"r{i}", (T0 + 1) * 1_000_000, ttft_us=t, gaps_us=g, status=s)
        for i, (t, g, s) in enumerate(rows)
    ]
    batch = RecordBatch.from_records(records)
    objectives = [Objective(Metric.TTFT, 0.15)] + [
        Objective(Metric.ITL, threshold_us / 1e6, s) for s in statistics
    ]
    groups = ItlGroups.of(batch)
    percentiles = {q: groups.percentile(q) for q in (50.0, 90.0, 99.0)}
    got = judge_values(batch, request_latencies(batch), percentiles, objectives)
    want = judge(batch, objectives)
    assert np.array_equal(got.good, want.good)
    assert np.array_equal(got.met, want.met)
    assert np.array_equal(got.judged, want.judged)


# -- Prometheus buckets from sketch buckets ---------------------------------------------

edge_values = st.sampled_from(LATENCY_BUCKETS_S).flatmap(
    lambda b: st.sampled_from(
        [b, np.nextafter(b, 0), np.nextafter(b, np.inf), b * 1.004, b / 1.004]
    )
)


@given(st.lists(edge_values | st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200))
def test_prom_index_from_sketch_buckets_equals_the_direct_search(values) -> None:
    array = np.asarray(values, dtype=np.float64)
    got = prom_index(array, LatencySketch.bucket_index(array))
    assert np.array_equal(got, bucket_index(array))


# -- sketch blob --------------------------------------------------------------------------


def test_blob_round_trip_and_the_empty_blob() -> None:
    counts = np.zeros((4, NB), dtype=np.int64)
    counts[0, 500] = 3
    counts[2, 10:20] = 7
    blob = encode_sketch_blob(counts)
    assert blob.startswith(b"GPRB\x01\x04")
    assert np.array_equal(decode_sketch_blob(blob), counts)
    assert not decode_sketch_blob(b"").any()
    assert not decode_sketch_blob(encode_sketch_blob(None)).any()
    sketches = rollup_sketches(blob)
    assert sketches["ttft"].count == 3 and sketches["itl"].count == 70


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"XX", "sketch blob: truncated, 2 bytes is shorter than its header"),
        (b"NOPE\x01\x00", "sketch blob: bad magic b'NOPE', expected b'GPRB'"),
        (b"GPRB\x09\x00", "sketch blob: unsupported version 9, expected 1"),
        (b"GPRB\x01\x01\x04ttft", "sketch blob: truncated or corrupt at byte 11"),
        (b"GPRB\x01\x00!", "sketch blob: 1 trailing bytes after 0 metrics"),
    ],
)
def test_malformed_blobs_are_refused_with_the_reason(blob, message) -> None:
    with pytest.raises(SketchError) as info:
        decode_sketch_blob(blob)
    assert str(info.value).startswith(message)


def test_a_corrupted_sketch_inside_the_blob_fails_its_checksum() -> None:
    counts = np.zeros((4, NB), dtype=np.int64)
    counts[1, 300] = 1
    blob = bytearray(encode_sketch_blob(counts))
    blob[-1] ^= 0xFF  # the last sketch's CRC
    with pytest.raises(SketchError, match="sketch bytes: checksum mismatch"):
        decode_sketch_blob(bytes(blob))
