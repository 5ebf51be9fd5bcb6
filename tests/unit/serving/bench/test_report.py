"""The bench's summary and per-request rows, from known client-side records."""

from __future__ import annotations

import numpy as np
import pytest

from exporters.records import Labels, RequestRecord, Status, Vantage
from exporters.slo import Metric, Objective, SLOError
from serving.bench.report import format_summary, parse_slo, per_request, summarize


def rec(rid: str, offsets_us: list[int], status: Status = Status.OK, tokens=None) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        vantage=Vantage.GATEWAY,
        arrival_time_ns=0,
        labels=Labels(model="m"),
        emission_offsets_us=np.array(offsets_us, dtype=np.int64),
        emission_tokens=None if tokens is None else np.array(tokens, dtype=np.int32),
        prompt_tokens=100,
        status=status,
    )


def test_parse_slo() -> None:
    assert parse_slo("ttft=0.2, itl:p99=0.05,e2el=3") == [
        Objective(Metric.TTFT, 0.2),
        Objective(Metric.ITL, 0.05, "p99"),
        Objective(Metric.E2EL, 3.0),
    ]
    for text, message in [
        ("ttft", "slo: expected metric=seconds, got 'ttft'"),
        ("ttft=fast", "slo: ttft: expected seconds, got 'fast'"),
        ("latency=1", "slo: metric must be one of ['ttft', 'tpot', 'itl', 'e2el'], got 'latency'"),
        ("", "slo: expected at least one metric=seconds, got ''"),
        ("ttft=-1", "objective.threshold_s must be > 0, got -1.0"),
    ]:
        with pytest.raises(SLOError) as info:
            parse_slo(text)
        assert str(info.value) == message


def test_summary_counts_latencies_and_goodput() -> None:
    records = [
        rec("a", [100_000, 110_000, 130_000]),  # TTFT 100 ms, gaps 10, 20 ms: good
        rec("b", [300_000, 305_000], tokens=[1, 3]),  # TTFT 300 ms: misses ttft
        rec("c", [50_000, 150_000]),  # gap 100 ms: misses itl
        rec("d", [], status=Status.ERROR),
    ]
    summary = summarize(records, parse_slo("ttft=0.2,itl=0.05"), duration_s=2.0)
    assert (summary["requests"], summary["completed"], summary["failed"]) == (4, 3, 1)
    assert summary["good"] == 1 and summary["goodput_rps"] == 0.5
    assert summary["attainment_ratio"] == 0.25
    assert summary["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert summary["ttft_ms"]["mean"] == pytest.approx(150.0)
    assert summary["itl_ms"]["p50"] == pytest.approx(15.0)  # gaps 10, 20, 5, 100
    assert summary["tpot_ms"]["p50"] == pytest.approx(15.0)  # 15, 5/3, 100
    assert summary["e2el_ms"]["p99"] == pytest.approx(150 + 0.98 * (305 - 150))  # of 130, 150, 305
    assert summary["total_output_tokens"] == 3 + 4 + 2
    assert summary["request_throughput_rps"] == 1.5
    text = format_summary(summary)
    assert "goodput (req/s) for ttft<=200ms, itl<=50ms" in text and "0.50" in text


def test_per_request_rows() -> None:
    rows = per_request([rec("a", [100_000, 110_000, 130_000]), rec("d", [], Status.ERROR)],
                       {"a": 0.0, "d": 0.5})  # fmt: skip
    assert rows[0]["request_id"] == "a" and rows[0]["status"] == "ok"
    assert rows[0]["ttft_s"] == 0.1 and rows[0]["itl_s"] == pytest.approx([0.01, 0.02])
    assert rows[1]["ttft_s"] is None and rows[1]["itl_s"] == [] and rows[1]["scheduled_s"] == 0.5
