"""Goodput queries on both backends: a replay with known token times through ingest must
give the metric core's offline exact answer; windows, scoping, dry runs, /metrics."""

from __future__ import annotations

import time
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from controlplane.models import KeyRole
from exporters._reference import reference_quantile_lower
from exporters.latency import itl_gaps_s, request_latencies
from exporters.records import Labels, RecordBatch, RequestRecord, Status, TokenDetail, Vantage
from exporters.slo import Metric, Objective, judge
from exporters.wire import CONTENT_TYPE_BINARY, encode_batch
from tests.integration.controlplane.conftest import MakeKey, bearer

pytestmark = pytest.mark.integration

SLOS = "/api/v1/slos"
TARGET = 0.9
OBJECTIVES = [
    {"metric": "ttft", "threshold_s": 0.3},
    {"metric": "tpot", "threshold_s": 0.025},
    {"metric": "itl", "threshold_s": 0.03, "statistic": "p90"},
]
CORE_OBJECTIVES = [
    Objective(Metric(o["metric"]), o["threshold_s"], o.get("statistic", "max")) for o in OBJECTIVES
]
STATUSES = [Status.OK] * 17 + [Status.ERROR, Status.ABORTED, Status.REJECTED]


def replay(n: int, seed: int = 7) -> list[RequestRecord]:
    """``n`` requests with known token times that all finished 5-75 s ago; one in five is
    for another model or seen by the engine (not selected by the SLO)."""
    rng = np.random.default_rng(seed)
    now_ns = time.time_ns()
    out: list[RequestRecord] = []
    for k in range(n):
        num = int(rng.integers(1, 40))
        chunks = rng.integers(1, 3, size=num).astype(np.int32)  # some emissions carry 2
        ttft_us = int(rng.gamma(3.0, 80_000))
        gaps = rng.gamma(2.0, 10_000, size=num - 1).astype(np.int64)
        offsets = ttft_us + np.concatenate(([0], np.cumsum(gaps)))
        status = STATUSES[int(rng.integers(len(STATUSES)))]
        finish_ago_ns = int(rng.uniform(5, 75) * 1e9)
        other = k % 5 == 4
        detail = TokenDetail.FULL
        if k % 7 == 3 and num >= 2:
            # A stat-logger-like record: the first and last emission only, gaps not carried.
            offsets = offsets[[0, -1]]
            chunks = np.array([1, int(chunks.sum()) - 1], dtype=np.int32)
            detail = TokenDetail.SUMMARY
        out.append(
            RequestRecord(
                request_id=f"r{k}",
                vantage=Vantage.ENGINE if other and k % 2 else Vantage.GATEWAY,
                arrival_time_ns=now_ns - finish_ago_ns - int(offsets[-1]) * 1000,
                labels=Labels(model="mistral" if other and not k % 2 else "llama"),
                emission_offsets_us=offsets.astype(np.int64),
                emission_tokens=chunks,
                token_detail=detail,
                status=status,
                reason="oom" if status is Status.ERROR else "",
            )
        )
    return out


def expected(records: list[RequestRecord]) -> dict[str, Any]:
    """The offline exact answer for the SLO, from the metric core and the reference."""
    chosen = [r for r in records if r.vantage is Vantage.GATEWAY and r.labels.model == "llama"]
    batch = RecordBatch.from_records(chosen)
    verdicts = judge(batch, CORE_OBJECTIVES)
    status = batch.status
    ok = status == Status.OK
    admitted = ok | (status == Status.ERROR) | (status == Status.ABORTED)
    tokens = batch.output_tokens()
    lat = request_latencies(batch)
    gaps, rows = itl_gaps_s(batch)
    keys = ["ttft", "tpot", "itl_p90"]
    return {
        "requests": verdicts.num_judged,
        "good": verdicts.num_good,
        "errors": int((status == Status.ERROR).sum()),
        "aborted": int((status == Status.ABORTED).sum()),
        "rejected": int((status == Status.REJECTED).sum()),
        "output_tokens": int(tokens[admitted].sum()),
        "good_output_tokens": int(tokens[verdicts.good].sum()),
        "violations": {
            key: int((verdicts.judged & verdicts.violated[:, k]).sum())
            for k, key in enumerate(keys)
        },
        "measured": dict(zip(keys, verdicts.num_measured, strict=True)),
        "values": {
            "ttft": lat.ttft_s[ok].tolist(),
            "tpot": lat.tpot_s[ok].tolist(),
            "e2el": lat.e2el_s[ok].tolist(),
            "itl": gaps[ok[rows]].tolist(),
        },
    }


async def ingest(
    client: httpx.AsyncClient, headers: dict[str, str], records: list[RequestRecord]
) -> None:
    for seq, start in enumerate(range(0, len(records), 100)):
        batch = RecordBatch.from_records(records[start : start + 100])
        body = encode_batch(batch, exporter_id="replay", seq=seq)
        response = await client.post(
            "/api/v1/ingest", content=body, headers={**headers, "Content-Type": CONTENT_TYPE_BINARY}
        )
        assert response.status_code == 200, response.text


async def create_slo(
    app: FastAPI, client: httpx.AsyncClient, headers: dict[str, str], **fields: Any
) -> Any:
    body = {
        "name": "chat",
        "selector": {"model": "llama"},
        "objectives": OBJECTIVES,
        "target": TARGET,
        "window_s": 86_400,
        **fields,
    }
    response = await client.post(SLOS, json=body, headers=headers)
    assert response.status_code == 201, response.text
    await app.state.live.refresh_slos()
    return response.json()


async def test_a_replay_gives_the_offline_exact_answer(
    app: FastAPI, client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    slo = await create_slo(app, client, admin_headers)
    records = replay(400)
    await ingest(client, admin_headers, records)
    truth = expected(records)
    stats = (
        await client.get(f"{SLOS}/{slo['id']}/goodput?window=5m", headers=admin_headers)
    ).json()
    for field in ("requests", "good", "errors", "aborted", "rejected", "violations", "measured"):
        assert stats[field] == truth[field], field
    judged = truth["requests"]
    assert 0 < truth["measured"]["itl_p90"] < judged  # the SUMMARY records' ITL is unmeasured
    assert stats["measured_ratio"] == {k: n / judged for k, n in truth["measured"].items()}
    assert stats["output_tokens"] == truth["output_tokens"]
    assert stats["good_output_tokens"] == truth["good_output_tokens"]
    judged, good = truth["requests"], truth["good"]
    assert stats["bad"] == judged - good
    assert stats["attainment_ratio"] == good / judged
    assert stats["burn_rate"] == pytest.approx((1 - good / judged) / (1 - TARGET), rel=1e-12)
    assert stats["error_budget_remaining_ratio"] == pytest.approx(
        1 - ((judged - good) / judged) / (1 - TARGET), rel=1e-12
    )
    admitted = judged + truth["aborted"]
    assert stats["admitted"] == admitted
    assert stats["availability_ratio"] == admitted / (admitted + truth["rejected"])
    assert stats["goodput_rps"] == pytest.approx(good / stats["duration_s"], rel=1e-12)
    assert stats["good_output_tokens_per_s"] == pytest.approx(
        truth["good_output_tokens"] / stats["duration_s"], rel=1e-12
    )
    assert 70 <= stats["duration_s"] <= 300  # the window, or since the earliest finish
    for metric, values in truth["values"].items():
        for q in (50, 90, 99):
            exact = reference_quantile_lower(values, q / 100)
            assert stats[metric][f"p{q}_s"] == pytest.approx(exact, rel=0.01 + 1e-9), (metric, q)
    everything = (await client.get("/api/v1/goodput?window=5m", headers=admin_headers)).json()
    assert everything["count"] == 1
    (same,) = everything["data"]
    for field in ("slo_id", "requests", "good", "violations", "measured", "ttft", "itl"):
        assert same[field] == stats[field], field


async def test_the_series_has_rejections_per_class_and_percentiles_per_vantage(
    app: FastAPI, client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    slo = await create_slo(app, client, admin_headers)
    records = replay(400, seed=11)
    for k, record in enumerate(records):
        record.labels = Labels(
            model=record.labels.model, priority=("critical", "sheddable", "")[k % 3]
        )
    await ingest(client, admin_headers, records)
    truth = expected(records)
    response = await client.get(
        f"{SLOS}/{slo['id']}/goodput/series?range=5m", headers=admin_headers
    )
    assert response.status_code == 200, response.text
    body = response.json()
    columns, by_class = body["columns"], body["rejected_by_class"]
    chosen = [r for r in records if r.vantage is Vantage.GATEWAY and r.labels.model == "llama"]
    rejected = [r for r in chosen if r.status is Status.REJECTED]
    assert set(by_class) == {r.labels.priority for r in rejected}
    for name, values in by_class.items():
        assert len(values) == len(columns["time"])
        assert sum(values) == sum(1 for r in rejected if r.labels.priority == name), name
    steps = [sum(values) for values in zip(*by_class.values(), strict=True)]
    assert steps == columns["rejected"]
    assert sum(steps) == truth["rejected"]
    vantages = body["percentiles_by_vantage"]
    assert set(vantages) == {"gateway", "engine"}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for q in ("p50", "p99"):
            name = f"{metric}_{q}_s"
            assert vantages["gateway"][name] == columns[name], name
    # The replay's engine-side llama records: OK ones drawn at the engine vantage.
    engine_ok = [
        r
        for r in records
        if r.vantage is Vantage.ENGINE and r.labels.model == "llama" and r.status is Status.OK
    ]
    assert engine_ok
    assert any(v is not None for v in vantages["engine"]["ttft_p50_s"])


async def test_dry_run_applies_candidate_thresholds_to_stored_requests(
    app: FastAPI, client: httpx.AsyncClient, admin_headers: dict[str, str], make_key: MakeKey
) -> None:
    await create_slo(app, client, admin_headers)
    records = replay(200, seed=3)
    await ingest(client, admin_headers, records)
    strict = [{"metric": "ttft", "threshold_s": 0.1}]
    viewer = bearer(await make_key(KeyRole.VIEWER))
    body = {
        "slo": {
            "name": "candidate",
            "selector": {"model": "llama"},
            "objectives": strict,
            "target": 0.5,
        },
        "window_s": 600,
    }
    response = await client.post(f"{SLOS}:dry-run", json=body, headers=viewer)
    assert response.status_code == 200, response.text
    result = response.json()
    chosen = [r for r in records if r.vantage is Vantage.GATEWAY and r.labels.model == "llama"]
    verdicts = judge(RecordBatch.from_records(chosen), [Objective(Metric.TTFT, 0.1)])
    assert (result["requests"], result["good"]) == (verdicts.num_judged, verdicts.num_good)
    assert result["violations"] == {"ttft": int((verdicts.judged & ~verdicts.met[:, 0]).sum())}
    assert result["measured"] == {"ttft": verdicts.num_judged}
    assert result["warnings"] == []
    assert result["slo_name"] == "candidate"
    # At the engine vantage an ITL objective is flagged: vLLM's records carry no gaps.
    itl = {**body["slo"], "vantage": "engine", "objectives": [{"metric": "itl", "threshold_s": 1}]}
    response = await client.post(f"{SLOS}:dry-run", json={**body, "slo": itl}, headers=viewer)
    assert response.status_code == 200, response.text
    (warning,) = response.json()["warnings"]
    assert warning.startswith("objective 'itl' (itl max <= 1 s) cannot be measured")
    # Nothing was saved.
    assert (await client.get(f"{SLOS}/candidate", headers=viewer)).status_code == 404
    response = await client.post(f"{SLOS}:dry-run", json={**body, "window_s": 7200}, headers=viewer)
    assert response.status_code == 422
    assert response.json()["detail"][0]["msg"] == "window_s must be in (0, 3600], got 7200"


async def test_windows_are_named_and_unknown_slos_are_404(
    app: FastAPI, client: httpx.AsyncClient, viewer_headers: dict[str, str], admin_headers: Any
) -> None:
    await create_slo(app, client, admin_headers)
    for window in ("10s", "1m", "5m", "1h", "1d", "compliance"):
        response = await client.get(f"{SLOS}/chat/goodput?window={window}", headers=viewer_headers)
        assert response.status_code == 200
    expected_windows = {"10s": 10, "1d": 86_400, "compliance": 86_400}
    for window, seconds in expected_windows.items():
        response = await client.get(f"{SLOS}/chat/goodput?window={window}", headers=viewer_headers)
        assert response.json()["window_s"] == seconds
    message = "window must be one of ['10s', '1m', '5m', '1h', '1d', 'compliance'], got '2m'"
    for url in (f"{SLOS}/chat/goodput?window=2m", "/api/v1/goodput?window=2m"):
        response = await client.get(url, headers=viewer_headers)
        assert response.status_code == 400
        assert response.json() == {"detail": message}
    default = await client.get(f"{SLOS}/chat/goodput", headers=viewer_headers)
    assert default.json()["window_s"] == 60
    assert (await client.get("/api/v1/goodput", headers=viewer_headers)).status_code == 200
    response = await client.get(f"{SLOS}/nope/goodput?window=1m", headers=viewer_headers)
    assert response.status_code == 404
    assert response.json() == {"detail": "SLO with name 'nope' not found"}
    response = await client.get(f"{SLOS}/chat/goodput?window=1m")
    assert response.status_code == 401


async def test_a_new_or_changed_slo_is_seen_by_the_next_query(
    app: FastAPI, client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    response = await client.post(
        SLOS,
        json={"name": "fresh", "objectives": OBJECTIVES, "target": 0.99},
        headers=admin_headers,
    )
    assert response.status_code == 201
    # No explicit refresh: the query itself brings the engine up to date.
    stats = (await client.get(f"{SLOS}/fresh/goodput?window=1m", headers=admin_headers)).json()
    assert stats["slo_name"] == "fresh"
    await client.patch(f"{SLOS}/fresh", json={"name": "renamed"}, headers=admin_headers)
    stats = (await client.get(f"{SLOS}/renamed/goodput?window=1m", headers=admin_headers)).json()
    assert stats["slo_name"] == "renamed"


async def test_tenant_scoped_viewers_see_their_slos_only(
    app: FastAPI, client: httpx.AsyncClient, admin_headers: dict[str, str], make_key: MakeKey
) -> None:
    await create_slo(app, client, admin_headers, name="acme", selector={"tenant": "acme"})
    await create_slo(app, client, admin_headers, name="globex", selector={"tenant": "globex"})
    acme = bearer(await make_key(KeyRole.VIEWER, tenant="acme", name="acme-viewer"))
    listing = (await client.get("/api/v1/goodput?window=1m", headers=acme)).json()
    assert [s["slo_name"] for s in listing["data"]] == ["acme"]
    response = await client.get(f"{SLOS}/globex/goodput?window=1m", headers=acme)
    assert response.status_code == 404
    body = {
        "slo": {
            "name": "peek",
            "selector": {"tenant": "globex"},
            "objectives": OBJECTIVES,
            "target": 0.9,
        }
    }
    response = await client.post(f"{SLOS}:dry-run", json=body, headers=acme)
    assert response.status_code == 403
    assert response.json() == {
        "detail": "this key is scoped to tenant 'acme': slo.selector.tenant must be 'acme', "
        "got 'globex'"
    }
    ingest_only = bearer(await make_key(KeyRole.INGEST, name="ingest-only"))
    response = await client.get("/api/v1/goodput?window=1m", headers=ingest_only)
    assert response.status_code == 403


async def test_metrics_need_a_viewer_key_when_not_open(
    settings: Any, make_key: MakeKey, client: httpx.AsyncClient, app: FastAPI
) -> None:
    app.state.settings = settings.model_copy(update={"open_metrics": False})
    assert (await client.get("/metrics")).status_code == 401
    viewer = bearer(await make_key(KeyRole.VIEWER))
    response = await client.get("/metrics", headers=viewer)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "goodput_engine_records_total" in response.text
    response = await client.get(
        "/metrics", headers={**viewer, "Accept": "application/openmetrics-text"}
    )
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")
