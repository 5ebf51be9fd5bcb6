"""The Prometheus collector: every family read back from a fresh CollectorRegistry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from controlplane.goodput import GoodputCollector, GoodputEngine
from exporters.records import RecordBatch, Status, TokenDetail
from exporters.slo import Metric, Objective
from tests.unit.controlplane.goodput.fixtures import T0, FakeClock, make_record, make_spec

US = 1_000_000


@pytest.fixture
def registry() -> CollectorRegistry:
    clock = FakeClock(T0 + 30)
    engine = GoodputEngine(clock=clock)
    spec = make_spec(
        [Objective(Metric.TTFT, 0.2), Objective(Metric.ITL, 0.03, "p99")],
        target=0.8,
        window_s=3600,
    )
    engine.set_slos([spec])
    at = (T0 + 20) * US
    engine.ingest(
        RecordBatch.from_records(
            [
                make_record("a", at, ttft_us=100_000, gaps_us=[10_000, 20_000]),
                make_record("b", at, ttft_us=150_000, gaps_us=[10_000]),
                make_record("c", at, ttft_us=300_000, gaps_us=[40_000]),
                make_record("d", at, status=Status.ABORTED),
                make_record("e", at, ttft_us=-1, status=Status.REJECTED),
                make_record("f", at, final=False, status=Status.IN_FLIGHT),
                make_record("old", at - 3 * 3600 * US),
            ]
        )
    )
    registry = CollectorRegistry()
    registry.register(GoodputCollector(engine, clock=lambda: T0 + 30))
    return registry


def test_request_and_violation_counters(registry: CollectorRegistry) -> None:
    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"slo": "name-s1", **labels})

    assert value("goodput_requests_total", vantage="gateway", result="good") == 2
    assert value("goodput_requests_total", vantage="gateway", result="bad") == 1
    assert value("goodput_requests_total", vantage="gateway", result="aborted") == 1
    assert value("goodput_requests_total", vantage="gateway", result="rejected") == 1
    assert value("goodput_slo_violations_total", objective="ttft") == 1
    assert value("goodput_slo_violations_total", objective="itl_p99") == 1
    assert value("goodput_requests_in_flight") == 1


def test_window_gauges(registry: CollectorRegistry) -> None:
    def value(name: str, window: str) -> float | None:
        return registry.get_sample_value(name, {"slo": "name-s1", "window": window})

    assert value("goodput_attainment_ratio", "1m") == pytest.approx(2 / 3)
    assert value("goodput_burn_rate", "1m") == pytest.approx((1 / 3) / 0.2)
    # History began 10 s ago (the earliest finish): rates divide by 10 s, not 60 s.
    assert value("goodput_requests_per_second", "1m") == pytest.approx(2 / 10)
    assert value("goodput_availability_ratio", "compliance") == pytest.approx(4 / 5)
    # Nothing judged in the last 10 s: the ratio is absent, not NaN; the rate is 0.
    assert value("goodput_attainment_ratio", "10s") is None
    assert value("goodput_requests_per_second", "10s") == 0.0
    budget = registry.get_sample_value("goodput_error_budget_remaining_ratio", {"slo": "name-s1"})
    assert budget == pytest.approx(1 - (1 / 3) / 0.2)


def test_latency_histograms(registry: CollectorRegistry) -> None:
    def bucket(metric: str, le: str) -> float | None:
        return registry.get_sample_value(
            f"goodput_{metric}_seconds_bucket", {"slo": "name-s1", "le": le}
        )

    assert bucket("ttft", "0.1") == 1
    assert bucket("ttft", "0.15") == 2
    assert bucket("ttft", "0.2") == 2
    assert bucket("ttft", "+Inf") == 3
    assert registry.get_sample_value(
        "goodput_ttft_seconds_sum", {"slo": "name-s1"}
    ) == pytest.approx(0.55)
    assert bucket("itl", "0.01") == 2
    assert bucket("itl", "+Inf") == 4
    assert registry.get_sample_value("goodput_itl_seconds_count", {"slo": "name-s1"}) == 4
    assert bucket("e2el", "+Inf") == 3
    assert bucket("tpot", "+Inf") == 3


def test_engine_health_counters(registry: CollectorRegistry) -> None:
    def records(outcome: str) -> float | None:
        return registry.get_sample_value("goodput_engine_records_total", {"outcome": outcome})

    assert records("final") == 6
    assert records("in_flight") == 1
    assert records("dropped_late") == 1
    assert records("late") == 0
    assert registry.get_sample_value("goodput_engine_dry_run_evicted_total") == 0


def test_describe_names_the_families_without_computing_them() -> None:
    engine = GoodputEngine(clock=FakeClock())
    names = {m.name for m in GoodputCollector(engine).describe()}
    assert {"goodput_requests", "goodput_burn_rate", "goodput_ttft_seconds"} <= names
    assert all(not m.samples for m in GoodputCollector(engine).describe())


def test_objective_measured_counter_counts_records_that_carry_the_metric() -> None:
    engine = GoodputEngine(clock=FakeClock(T0 + 30))
    engine.set_slos([make_spec([Objective(Metric.TTFT, 0.2), Objective(Metric.ITL, 0.03)])])
    at = (T0 + 20) * US
    engine.ingest(
        RecordBatch.from_records(
            [
                make_record("full", at, gaps_us=[10_000]),
                make_record("summary", at, gaps_us=[90_000], detail=TokenDetail.SUMMARY),
                make_record("one-token", at, gaps_us=[], detail=TokenDetail.SUMMARY),
            ]
        )
    )
    registry = CollectorRegistry()
    registry.register(GoodputCollector(engine, clock=lambda: T0 + 30))

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"slo": "name-s1", **labels})

    assert value("goodput_slo_objective_measured_total", objective="ttft") == 3
    # The SUMMARY record of two tokens does not carry its gap; one token has none to carry.
    assert value("goodput_slo_objective_measured_total", objective="itl") == 2
    assert value("goodput_slo_violations_total", objective="itl") == 0
    assert value("goodput_requests_total", vantage="gateway", result="good") == 3


def test_slo_gauges_for_the_rules_of_all_slos(registry: CollectorRegistry) -> None:
    """Target, compliance window and info series (``dashboards.shared_rules`` joins them)."""

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"slo": "name-s1", **labels})

    assert value("goodput_slo_objective_ratio", sli="goodput") == 0.8
    assert value("goodput_slo_objective_ratio", sli="availability") is None
    assert value("goodput_slo_window_seconds") == 3600
    info = {
        "slo_id": "s1",
        "slo_version": "1",
        "objective": "ttft <= 0.2 s and itl p99 <= 0.03 s",
        "vantage": "gateway",
    }
    assert value("goodput_slo_info", **info) == 1
