"""PrometheusExporter (scrape-time histograms and counters) and the shared buckets."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from exporters._reference import reference_gaps_s, reference_latencies
from exporters.buckets import LATENCY_BUCKETS_S, bucket_index, validate_buckets
from exporters.prometheus import OVERFLOW_LABEL, KVTransferExporter, PrometheusExporter
from exporters.records import NUM_PHASES, Labels, Phase, RequestRecord, Status, Vantage

GW = {"model": "llama", "vantage": "gateway"}


def record(
    offsets_ms: list[float],
    *,
    tokens: list[int] | None = None,
    status: Status = Status.OK,
    model: str = "llama",
    slo: str = "",
    vantage: Vantage = Vantage.GATEWAY,
    prompt_tokens: int = 0,
    final: bool = True,
    finished_ms: float | None = None,
) -> RequestRecord:
    phases = np.full(NUM_PHASES, -1, dtype=np.int64)
    if finished_ms is not None:
        phases[Phase.FINISHED] = round(finished_ms * 1000)
    return RequestRecord(
        request_id="r",
        vantage=vantage,
        arrival_time_ns=1_700_000_000_000_000_000,
        labels=Labels(model=model, slo=slo),
        emission_offsets_us=np.array([round(ms * 1000) for ms in offsets_ms], dtype=np.int64),
        emission_tokens=None if tokens is None else np.array(tokens, dtype=np.int32),
        phase_offsets_us=phases,
        prompt_tokens=prompt_tokens,
        status=status,
        final=final,
    )


def bucket(registry: CollectorRegistry, metric: str, le: str, **labels: str) -> float | None:
    return registry.get_sample_value(f"{metric}_bucket", {**GW, **labels, "le": le})


def test_an_slo_threshold_value_lands_in_its_own_bucket() -> None:
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry)
    exporter.export(record([200.0]))  # TTFT exactly 200 ms
    exporter.export(record([200.001]))  # 1 µs more

    ttft = "goodput_request_ttft_seconds"
    assert bucket(registry, ttft, "0.15") == 0
    assert bucket(registry, ttft, "0.2") == 1
    assert bucket(registry, ttft, "0.25") == 2
    assert bucket(registry, ttft, "+Inf") == 2
    assert registry.get_sample_value(f"{ttft}_count", GW) == 2
    assert registry.get_sample_value(f"{ttft}_sum", GW) == pytest.approx(0.400001)


def test_itl_is_observed_once_per_gap_and_tpot_counts_chunk_tokens() -> None:
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry)
    # emissions at 100, 120 (a chunk of 3 tokens) and 170 ms: gaps of 20 and 50 ms
    exporter.export(record([100.0, 120.0, 170.0], tokens=[1, 3, 1]))

    itl = "goodput_request_itl_seconds"
    assert bucket(registry, itl, "0.015") == 0
    assert bucket(registry, itl, "0.02") == 1
    assert bucket(registry, itl, "0.05") == 2
    assert registry.get_sample_value(f"{itl}_count", GW) == 2
    assert registry.get_sample_value(f"{itl}_sum", GW) == pytest.approx(0.07)
    tpot = "goodput_request_tpot_seconds"  # (170 - 100) ms / (5 - 1) = 17.5 ms
    assert bucket(registry, tpot, "0.015") == 0 and bucket(registry, tpot, "0.02") == 1
    assert registry.get_sample_value(f"{tpot}_sum", GW) == pytest.approx(0.0175)
    assert registry.get_sample_value("goodput_request_e2el_seconds_sum", GW) == pytest.approx(0.17)
    assert registry.get_sample_value("goodput_output_tokens_total", GW) == 5


def test_requests_are_counted_by_status_and_only_successes_enter_histograms() -> None:
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry)
    exporter.export(record([10.0, 20.0], prompt_tokens=100))
    exporter.export(record([10.0], status=Status.ERROR, prompt_tokens=50))
    exporter.export(record([], status=Status.ABORTED, finished_ms=5.0))
    exporter.export(record([], status=Status.REJECTED))
    exporter.export(record([1.0, 2.0, 3.0], final=False))  # a partial: not counted

    for status, count in (("ok", 1), ("error", 1), ("aborted", 1), ("rejected", 1)):
        assert registry.get_sample_value("goodput_requests_total", {**GW, "status": status}) == (
            count
        )
    assert registry.get_sample_value("goodput_request_ttft_seconds_count", GW) == 1
    assert registry.get_sample_value("goodput_request_e2el_seconds_count", GW) == 1
    assert registry.get_sample_value("goodput_output_tokens_total", GW) == 3
    assert registry.get_sample_value("goodput_prompt_tokens_total", GW) == 150


def test_label_sets_are_kept_apart_and_slo_is_optional() -> None:
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry, slo_label=True)
    exporter.export(record([10.0], model="a", slo="chat"))
    exporter.export(record([10.0], model="a", slo="batch"))
    exporter.export(record([10.0], model="b", slo="chat", vantage=Vantage.ENGINE))

    def count(model: str, vantage: str, slo: str) -> float | None:
        return registry.get_sample_value(
            "goodput_request_ttft_seconds_count", {"model": model, "vantage": vantage, "slo": slo}
        )

    assert count("a", "gateway", "chat") == 1
    assert count("a", "gateway", "batch") == 1
    assert count("b", "engine", "chat") == 1
    assert count("b", "gateway", "chat") is None
    plain = CollectorRegistry()
    PrometheusExporter(plain).export(record([10.0], slo="chat"))
    assert plain.get_sample_value("goodput_request_ttft_seconds_count", GW) == 1


def test_label_sets_beyond_the_limit_fold_into_one_overflow_series() -> None:
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry, max_label_sets=2)
    for model in ("a", "b", "c", "d", "a"):
        exporter.export(record([10.0], model=model))
    exporter.force_flush()

    overflow = {"model": OVERFLOW_LABEL, "vantage": "gateway"}
    assert registry.get_sample_value("goodput_request_ttft_seconds_count", overflow) == 2
    assert (
        registry.get_sample_value(
            "goodput_request_ttft_seconds_count", {"model": "a", "vantage": "gateway"}
        )
        == 2
    )
    assert exporter.num_overflow_records == 2


def test_folding_between_scrapes_keeps_totals_exact() -> None:
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry, fold_every=3)
    for i in range(10):
        exporter.export(record([float(10 * (i + 1))]))
        if i == 4:
            assert registry.get_sample_value("goodput_request_ttft_seconds_count", GW) == 5
    assert registry.get_sample_value("goodput_request_ttft_seconds_count", GW) == 10
    assert bucket(registry, "goodput_request_ttft_seconds", "0.05") == 5


def test_an_invalid_record_is_left_out_and_counted() -> None:
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry)
    exporter.export(record([30.0, 10.0]))  # time runs backwards
    exporter.export(record([10.0]))
    assert registry.get_sample_value("goodput_request_ttft_seconds_count", GW) == 1
    assert exporter.num_invalid_records == 1


def test_shutdown_keeps_the_metrics_and_ignores_later_records() -> None:
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry)
    exporter.export(record([10.0]))
    exporter.shutdown()
    exporter.shutdown()
    exporter.export(record([10.0]))
    assert exporter.force_flush() is True
    assert registry.get_sample_value("goodput_request_ttft_seconds_count", GW) == 1


def test_registers_on_its_own_registry_only() -> None:
    registry = CollectorRegistry()
    PrometheusExporter(registry).export(record([10.0]))
    assert REGISTRY.get_sample_value("goodput_request_ttft_seconds_count", GW) is None
    text = generate_latest(registry).decode()
    assert 'goodput_request_ttft_seconds_bucket{le="0.01",model="llama",vantage="gateway"} 1.0' in (
        text
    )
    assert "# TYPE goodput_requests_total counter" in text
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        PrometheusExporter(registry)


def test_constructor_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="max_label_sets must be >= 1, got 0"):
        PrometheusExporter(CollectorRegistry(), max_label_sets=0)
    with pytest.raises(ValueError, match=r"buckets\[1\]: must be strictly increasing, got 0.1"):
        PrometheusExporter(CollectorRegistry(), buckets=[0.2, 0.1])


def test_buckets_hold_every_common_slo_threshold_exactly() -> None:
    for threshold_ms in (10, 20, 25, 50, 100, 200, 250, 500, 1000):
        assert threshold_ms / 1000 in LATENCY_BUCKETS_S
    assert validate_buckets(LATENCY_BUCKETS_S) == LATENCY_BUCKETS_S
    idx = bucket_index(np.array([0.0004, 0.2, 0.2000001, 400.0, math.nan]))
    assert idx.tolist() == [0, 16, 17, 37, 37]
    with pytest.raises(ValueError, match=r"buckets\[0\]: must be finite and > 0, got -1.0"):
        validate_buckets([-1.0])


@st.composite
def records(draw: st.DrawFn) -> RequestRecord:
    on_boundary = st.sampled_from([5_000, 20_000, 50_000, 200_000])  # µs: exactly an `le`
    gaps = draw(st.lists(st.integers(0, 400_000) | on_boundary, min_size=0, max_size=12))
    offsets = np.cumsum(np.array(gaps, dtype=np.int64)) if gaps else np.zeros(0, np.int64)
    chunked = draw(st.booleans())
    tokens = (
        np.array(
            draw(st.lists(st.integers(1, 4), min_size=len(gaps), max_size=len(gaps))),
            dtype=np.int32,
        )
        if chunked
        else None
    )
    return RequestRecord(
        request_id="r",
        vantage=Vantage.GATEWAY,
        arrival_time_ns=0,
        labels=Labels(model="llama"),
        emission_offsets_us=offsets,
        emission_tokens=tokens,
        status=draw(st.sampled_from([Status.OK, Status.OK, Status.ERROR])),
    )


@settings(max_examples=50, deadline=None)
@given(st.lists(records(), min_size=1, max_size=15))
def test_bucket_counts_match_a_brute_force_count(batch: list[RequestRecord]) -> None:
    registry = CollectorRegistry()
    exporter = PrometheusExporter(registry, fold_every=4)
    for r in batch:
        exporter.export(r)

    ok = [r for r in batch if r.status == Status.OK]
    refs = [reference_latencies(r) for r in ok]
    observed = {
        "goodput_request_ttft_seconds": [x.ttft_s for x in refs],
        "goodput_request_tpot_seconds": [x.tpot_s for x in refs],
        "goodput_request_e2el_seconds": [x.e2el_s for x in refs],
        "goodput_request_itl_seconds": [g for r in ok for g in reference_gaps_s(r)],
    }
    for metric, values in observed.items():
        defined = [v for v in values if not math.isnan(v)]
        for le in (0.005, 0.02, 0.05, 0.2, 1.0):
            assert bucket(registry, metric, repr(le)) == sum(v <= le for v in defined)
        assert registry.get_sample_value(f"{metric}_count", GW) == len(defined)
        assert registry.get_sample_value(f"{metric}_sum", GW) == pytest.approx(sum(defined))


def kv_record(
    kv_bytes: int, handoff_ms: tuple[float, float] | None, *, model: str = "llama"
) -> RequestRecord:
    rec = record([50.0, 60.0], vantage=Vantage.ENGINE, model=model)
    rec.kv_bytes = kv_bytes
    if handoff_ms is not None:
        rec.phase_offsets_us[Phase.KV_HANDOFF_START] = round(handoff_ms[0] * 1000)
        rec.phase_offsets_us[Phase.KV_HANDOFF_END] = round(handoff_ms[1] * 1000)
    return rec


def test_kv_transfer_bytes_and_handoff_times_per_model_and_vantage() -> None:
    registry = CollectorRegistry()
    exporter = KVTransferExporter(registry)
    text = generate_latest(registry).decode()  # declared before any record
    assert "# TYPE goodput_kv_transfer_bytes_total counter" in text
    assert "# TYPE goodput_kv_transfer_seconds histogram" in text
    exporter.export(kv_record(1_000, (0.0, 4.0)))
    exporter.export(kv_record(3_000, (1.0, 21.0)))
    exporter.export(kv_record(0, None))  # a prefill leg: no series of its own
    exporter.export(kv_record(0, None, model="other"))
    labels = {"model": "llama", "vantage": "engine"}
    assert registry.get_sample_value("goodput_kv_transfer_bytes_total", labels) == 4_000
    assert registry.get_sample_value("goodput_kv_transfer_seconds_count", labels) == 2
    assert registry.get_sample_value("goodput_kv_transfer_seconds_sum", labels) == pytest.approx(
        0.024
    )
    le = {**labels, "le": "0.005"}
    assert registry.get_sample_value("goodput_kv_transfer_seconds_bucket", le) == 1
    le = {**labels, "le": "0.025"}
    assert registry.get_sample_value("goodput_kv_transfer_seconds_bucket", le) == 2
    other = {"model": "other", "vantage": "engine"}
    assert registry.get_sample_value("goodput_kv_transfer_bytes_total", other) is None


def test_kv_transfer_label_sets_are_bounded() -> None:
    registry = CollectorRegistry()
    exporter = KVTransferExporter(registry, max_label_sets=1)
    exporter.export(kv_record(10, None, model="a"))
    exporter.export(kv_record(20, None, model="b"))
    overflow = {"model": OVERFLOW_LABEL, "vantage": "engine"}
    assert registry.get_sample_value("goodput_kv_transfer_bytes_total", overflow) == 20
    assert exporter.num_overflow_records == 1
