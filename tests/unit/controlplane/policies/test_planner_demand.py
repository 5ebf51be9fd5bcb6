"""The planner's demand window: rates and variability from ingested records."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.policies.planner_demand import DemandWindow
from exporters.records import RecordBatch, RequestRecord, Vantage

T0_NS = 1_800_000_000 * 10**9


def batch(
    n: int,
    *,
    vantage: Vantage = Vantage.GATEWAY,
    prompt: int = 1000,
    tokens: int = 4,
    gap_ms: int = 100,
    final: bool = True,
) -> RecordBatch:
    return RecordBatch.from_records(
        [
            RequestRecord(
                request_id=f"{vantage.name}-{k}",
                vantage=vantage,
                arrival_time_ns=T0_NS + k * gap_ms * 10**6,
                prompt_tokens=prompt,
                emission_offsets_us=np.arange(tokens, dtype=np.int64) * 20_000 + 100_000,
                final=final,
            )
            for k in range(n)
        ]
    )


def test_rates_over_the_window() -> None:
    window = DemandWindow(60.0)
    window.observe(batch(30), now_s=100.0)
    window.observe(batch(30), now_s=130.0)
    demand = window.demand(160.0)  # 60 s since the first batch
    assert demand.requests_per_s == pytest.approx(1.0)
    assert demand.prompt_tokens_per_s == pytest.approx(1000.0)
    assert demand.output_tokens_per_s == pytest.approx(4.0)
    assert demand.service_scv == pytest.approx(0.0)
    later = window.demand(185.0)  # the first batch left the window
    assert later.requests_per_s == pytest.approx(0.5)


def test_variability_of_arrivals() -> None:
    window = DemandWindow(60.0)
    window.observe(batch(60, gap_ms=0), now_s=10.0)  # a burst: all at once
    window.observe(batch(10, gap_ms=1000), now_s=10.0)  # then one a second
    # 60 gaps of 0 and 9 of 1 s: c² = var/mean² = (1 - p)/p with p = 9/69.
    assert window.demand(10.0).arrival_scv == pytest.approx(60 / 9)
    steady = DemandWindow(60.0)
    steady.observe(batch(20, gap_ms=250), now_s=10.0)
    assert steady.demand(10.0).arrival_scv == pytest.approx(0.0, abs=1e-9)


def test_gateway_records_win_and_engine_records_stand_in() -> None:
    window = DemandWindow(60.0)
    # A PD request has a prefill engine record with one token: never counted.
    window.observe(batch(10, vantage=Vantage.ENGINE, tokens=1), now_s=5.0)
    assert window.demand(5.0).requests_per_s == 0.0
    window.observe(batch(10, vantage=Vantage.ENGINE, tokens=5), now_s=5.0)
    assert window.demand(5.0).requests_per_s == pytest.approx(10.0)
    window.observe(batch(4, vantage=Vantage.GATEWAY), now_s=5.0)
    assert window.demand(5.0).requests_per_s == pytest.approx(4.0)
    window.observe(batch(5, final=False), now_s=5.0)  # partial updates are not requests
    assert window.demand(5.0).requests_per_s == pytest.approx(4.0)


def test_empty_and_bad_window() -> None:
    assert DemandWindow(10.0).demand(0.0).requests_per_s == 0.0
    with pytest.raises(ValueError, match="window_s must be > 0, got 0"):
        DemandWindow(0)


def test_a_backfill_is_spread_over_the_arrivals() -> None:
    """Records of the last minute received at once (a control plane that just started):
    the rate divides by the minute they cover, not by the second since they came."""
    window = DemandWindow(60.0)
    window.observe(batch(600, gap_ms=100), now_s=1000.0)
    assert window.demand(1000.5).requests_per_s == pytest.approx(600 / 59.9)


def test_requests_added_at_the_gateway_trim_by_arrival() -> None:
    window = DemandWindow(10.0)
    for k in range(20):
        window.add(float(k), 2000, 50)
    assert window.means(19.0) == (11, 2000.0, 50.0)
    demand = window.demand(19.0)
    assert demand.requests_per_s == pytest.approx(11 / 10.0)
    assert demand.prompt_tokens_per_s == pytest.approx(2000 * 11 / 10.0)
    assert demand.arrival_scv == pytest.approx(0.0)  # one request a second, exactly
    assert window.means(40.0) == (0, 0.0, 0.0)
