"""The overview's rows from a live engine (no I/O): status by the multiwindow burn rates,
most burning first, sparklines per complete minute, filters, the stream's events, and a
stream that starts from the rows a client holds."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from controlplane.api.routes.goodput_summary import _event, _summary_events
from controlplane.goodput import GoodputEngine
from controlplane.runtime.summary import (
    SPARK_MINUTES,
    SharedSummary,
    SummaryFilter,
    compute_summary,
)
from exporters.records import Labels, RecordBatch, Status
from tests.unit.controlplane.goodput.fixtures import T0, FakeClock, make_record, make_spec

US = 1_000_000


def _engine() -> tuple[GoodputEngine, float]:
    clock = FakeClock(T0)
    engine = GoodputEngine(clock=clock)
    engine.set_slos(
        [
            make_spec(slo_id="bad", selector={"model": "bad", "tenant": "acme"}, target=0.99),
            make_spec(slo_id="good", selector={"model": "good"}, target=0.99),
            make_spec(slo_id="idle", selector={"model": "idle"}, target=0.99),
        ]
    )
    now = T0 + 600.5
    clock.now = now
    records = [
        make_record(
            f"{model}{k}",
            (T0 + 300 + k) * US,
            labels=Labels(model=model, tenant="acme"),
            status=Status.ERROR if model == "bad" else Status.OK,
        )
        for k in range(240)
        for model in ("bad", "good")
    ]
    engine.ingest(RecordBatch.from_records(records))
    return engine, now


def test_rows_have_status_order_and_numbers() -> None:
    engine, now = _engine()
    rows = compute_summary(engine, now)
    assert [(r.slo_id, r.status) for r in rows] == [
        ("bad", "critical"),
        ("good", "ok"),
        ("idle", "no_data"),
    ]
    bad, good, idle = rows
    assert bad.attainment_ratio == 0.0 and bad.burn_rate_1h == 100.0
    assert bad.error_budget_remaining_ratio < 0
    assert (bad.model, bad.tenant, bad.vantage, bad.target) == ("bad", "acme", "gateway", 0.99)
    assert good.attainment_ratio == 1.0 and good.burn_rate_5m == 0.0
    # the 5 min window is the 300 one-second slots ending with now's: requests 1 … 239
    assert good.goodput_rps == round(239 / 300, 4)
    assert idle.attainment_ratio is None and idle.burn_rate_6h is None
    assert idle.error_budget_remaining_ratio == 1.0


def test_sparkline_is_goodput_per_complete_minute() -> None:
    engine, now = _engine()
    good = next(r for r in compute_summary(engine, now) if r.slo_id == "good")
    assert len(good.spark) == SPARK_MINUTES
    current = int(now) // 60
    expected = [
        round(sum(1 for k in range(240) if (T0 + 300 + k) // 60 == m) / 60, 4)
        for m in range(current - SPARK_MINUTES, current)
    ]
    assert good.spark == expected
    assert sum(good.spark) > 0


def test_filter_keeps_only_matching_rows() -> None:
    engine, now = _engine()
    rows = compute_summary(engine, now)
    assert [r.slo_id for r in rows if SummaryFilter(model="good").admits(r)] == ["good"]
    assert [r.slo_id for r in rows if SummaryFilter(scope="acme").admits(r)] == ["bad"]
    assert [r.slo_id for r in rows if SummaryFilter(vantage="engine").admits(r)] == []


def test_event_carries_its_time_as_id_and_only_the_rows_given() -> None:
    text = _event(12.5, ['{"slo_id":"a"}'], False, None)
    lines = text.split("\n")
    assert lines[:2] == ["id: 12.5", "event: summary"]
    assert text.endswith("\n\n")
    payload = json.loads(lines[2].removeprefix("data: "))
    assert payload == {"time": 12.5, "rows": [{"slo_id": "a"}], "full": False}
    ordered = json.loads(_event(1.0, [], True, ["b", "a"]).split("\n")[2][6:])
    assert ordered == {"time": 1.0, "rows": [], "full": True, "order": ["b", "a"]}


def _first_events(shared: SharedSummary, since: float | None) -> list[str]:
    async def read() -> list[str]:
        events = _summary_events(shared, SummaryFilter(), 1.0, since)
        return [await anext(events), await anext(events)]

    with ThreadPoolExecutor(1) as pool:  # the browser tests' loop may be running here
        return pool.submit(asyncio.run, read()).result()


def test_stream_starts_from_the_rows_a_client_holds() -> None:
    engine, now = _engine()
    live = SimpleNamespace(engine=engine, clock=lambda: now, stopping=asyncio.Event())
    shared = SharedSummary(live)  # type: ignore[arg-type]
    with ThreadPoolExecutor(1) as pool:
        held, rows = pool.submit(asyncio.run, shared.rows(SummaryFilter(), 10.0)).result()
    assert len(rows) == 3
    retry, resumed = _first_events(shared, since=held)
    assert retry == "retry: 3000\n\n"
    assert json.loads(resumed.split("\n")[2][6:]) == {"time": held, "rows": [], "full": False}
    _, fresh = _first_events(shared, since=held - 1.0)  # not kept: every row, in order
    payload = json.loads(fresh.split("\n")[2][6:])
    assert payload["full"] is True
    assert payload["order"] == ["bad", "good", "idle"] == [r["slo_id"] for r in payload["rows"]]
