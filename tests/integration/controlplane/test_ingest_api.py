"""POST /api/v1/ingest on both backends: idempotency, whole-batch errors, limits, roles."""

from __future__ import annotations

import gzip
import json
import time
from typing import Any

import httpx
import msgpack
import numpy as np
import pytest
from fastapi import FastAPI

from controlplane.models import KeyRole
from exporters.records import Labels, RecordBatch, RequestRecord, Vantage
from exporters.wire import CONTENT_TYPE_BINARY, batch_to_json, encode_batch
from tests.integration.controlplane.conftest import MakeKey, bearer

pytestmark = pytest.mark.integration

INGEST = "/api/v1/ingest"
SLOS = "/api/v1/slos"
BINARY = {"Content-Type": CONTENT_TYPE_BINARY}


def records(n: int, *, tenant: str = "acme", ttft_us: int = 100_000) -> RecordBatch:
    """``n`` requests that finished a few seconds ago, 3 tokens each, 20 ms apart."""
    arrival_ns = time.time_ns() - 5_000_000_000
    return RecordBatch.from_records(
        [
            RequestRecord(
                request_id=f"r{k}",
                vantage=Vantage.GATEWAY,
                arrival_time_ns=arrival_ns,
                labels=Labels(model="llama", tenant=tenant),
                emission_offsets_us=np.array([ttft_us, ttft_us + 20_000, ttft_us + 40_000]),
            )
            for k in range(n)
        ]
    )


def binary(batch: RecordBatch, seq: int = 0, exporter_id: str = "gw-0") -> bytes:
    return encode_batch(batch, exporter_id=exporter_id, seq=seq)


async def create_slo(client: httpx.AsyncClient, headers: dict[str, str], **fields: Any) -> Any:
    body = {
        "name": "chat",
        "selector": {"model": "llama"},
        "objectives": [{"metric": "ttft", "threshold_s": 0.2}],
        "target": 0.9,
        "window_s": 86_400,
        **fields,
    }
    response = await client.post(SLOS, json=body, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


async def requests_counted(app: FastAPI, client: httpx.AsyncClient, headers: dict[str, str]) -> int:
    response = await client.get(f"{SLOS}/chat/goodput?window=1m", headers=headers)
    assert response.status_code == 200, response.text
    count: int = response.json()["requests"]
    return count


@pytest.fixture
async def ingest_headers(make_key: MakeKey) -> dict[str, str]:
    return {**bearer(await make_key(KeyRole.INGEST, name="test-ingest")), **BINARY}


@pytest.fixture
async def slo(client: httpx.AsyncClient, admin_headers: dict[str, str], app: FastAPI) -> Any:
    created = await create_slo(client, admin_headers)
    await app.state.live.refresh_slos()
    return created


async def test_a_batch_applies_once_and_a_resend_is_a_duplicate(
    app: FastAPI,
    client: httpx.AsyncClient,
    ingest_headers: dict[str, str],
    admin_headers: dict[str, str],
    slo: Any,
) -> None:
    body = binary(records(3))
    first = await client.post(INGEST, content=body, headers=ingest_headers)
    assert first.status_code == 200, first.text
    assert first.json() == {
        "duplicate": False,
        "exporter_id": "gw-0",
        "seq": 0,
        "num_records": 3,
        "num_final": 3,
        "num_emissions": 9,
        "num_tokens": 9,
        "num_rejected": 0,
        "rejected": [],
    }
    again = await client.post(INGEST, content=body, headers=ingest_headers)
    assert again.status_code == 200
    assert again.json()["duplicate"] is True
    assert again.json()["num_records"] == 0
    assert await requests_counted(app, client, admin_headers) == 3


async def test_records_the_engine_cannot_place_are_listed_and_the_rest_applied(
    app: FastAPI,
    client: httpx.AsyncClient,
    ingest_headers: dict[str, str],
    admin_headers: dict[str, str],
    slo: Any,
) -> None:
    """Regression: arrival <= 0 was answered 200 and counted in goodput_ingest_records_total,
    then dropped by the engine without a word."""
    good = records(3)
    bad = RecordBatch.from_records([next(records(1).records())])
    bad.arrival_time_ns[0] = 0
    bad.request_ids[0] = "zero"
    response = await client.post(
        INGEST, content=binary(RecordBatch.concat([good, bad])), headers=ingest_headers
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["num_records"], body["num_rejected"]) == (3, 1)
    assert body["rejected"] == [
        {
            "index": 3,
            "request_id": "zero",
            "field": "arrival_time_ns",
            "msg": "arrival_time_ns must be >= 946684800000000000 (2000-01-01T00:00:00Z), got 0",
        }
    ]
    assert await requests_counted(app, client, admin_headers) == 3
    metrics = (await client.get("/metrics", headers=admin_headers)).text
    assert 'goodput_ingest_records_total{protocol="wire"} 3.0' in metrics
    assert 'goodput_ingest_rejected_records_total{protocol="wire"} 1.0' in metrics


async def test_json_and_gzip_bodies_are_accepted(
    app: FastAPI,
    client: httpx.AsyncClient,
    ingest_headers: dict[str, str],
    admin_headers: dict[str, str],
    slo: Any,
) -> None:
    as_json = json.dumps(batch_to_json(records(2), exporter_id="js", seq=0)).encode()
    headers = {**ingest_headers, "Content-Type": "application/json"}
    response = await client.post(INGEST, content=as_json, headers=headers)
    assert response.status_code == 200, response.text
    gz = gzip.compress(binary(records(1), exporter_id="gz"))
    response = await client.post(
        INGEST, content=gz, headers={**ingest_headers, "Content-Encoding": "gzip"}
    )
    assert response.status_code == 200, response.text
    assert await requests_counted(app, client, admin_headers) == 3


def _corrupted(body: bytes) -> bytes:
    envelope = msgpack.unpackb(body)
    inner = bytearray(envelope["body"])
    inner[-1] ^= 0xFF
    envelope["body"] = bytes(inner)
    out: bytes = msgpack.packb(envelope, use_bin_type=True)
    return out


async def test_undecodable_bodies_are_400_and_apply_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    ingest_headers: dict[str, str],
    admin_headers: dict[str, str],
    slo: Any,
) -> None:
    good = binary(records(2))
    cases = {
        good[:-7]: "batch: truncated (the message ends early)",
        b"\xc1": "batch: not a msgpack message (reserved format byte)",
    }
    for body, detail in cases.items():
        response = await client.post(INGEST, content=body, headers=ingest_headers)
        assert response.status_code == 400, response.text
        assert response.json() == {"detail": detail}
    response = await client.post(INGEST, content=_corrupted(good), headers=ingest_headers)
    assert response.status_code == 400
    assert response.json()["detail"].startswith("crc32: checksum mismatch")
    bad_json = {**ingest_headers, "Content-Type": "application/json"}
    response = await client.post(INGEST, content=b"{nope", headers=bad_json)
    assert response.status_code == 400
    assert response.json()["detail"].startswith("batch: invalid JSON")
    assert await requests_counted(app, client, admin_headers) == 0


async def test_a_batch_breaking_the_contract_is_422_naming_the_field(
    app: FastAPI,
    client: httpx.AsyncClient,
    ingest_headers: dict[str, str],
    admin_headers: dict[str, str],
    slo: Any,
) -> None:
    document = batch_to_json(records(2), exporter_id="js", seq=0)
    document["emission_offsets_us"][1] = [50_000, 40_000, 60_000]  # time runs backwards
    headers = {**ingest_headers, "Content-Type": "application/json"}
    response = await client.post(INGEST, content=json.dumps(document).encode(), headers=headers)
    assert response.status_code == 422
    assert response.json() == {
        "detail": [
            {
                "loc": ["body", "emission_offsets_us"],
                "field": "emission_offsets_us",
                "msg": "emission_offsets_us: non-monotonic token times in request 'r1' at "
                "emission 1",
                "type": "value_error",
            }
        ]
    }
    document = batch_to_json(records(1), exporter_id="js", seq=1)
    document["v"] = 9
    response = await client.post(INGEST, content=json.dumps(document).encode(), headers=headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["msg"] == (
        "v: unsupported wire version 9; supported versions: [1]"
    )
    assert await requests_counted(app, client, admin_headers) == 0
    # The refused seq was not marked: the same seq with a valid batch is applied.
    fixed = batch_to_json(records(1), exporter_id="js", seq=0)
    response = await client.post(INGEST, content=json.dumps(fixed).encode(), headers=headers)
    assert response.json()["duplicate"] is False


async def test_size_limit_content_type_and_stale_seq(
    app: FastAPI, client: httpx.AsyncClient, ingest_headers: dict[str, str]
) -> None:
    limit = app.state.settings.max_ingest_bytes
    response = await client.post(
        INGEST, content=b"x" * 16, headers={**ingest_headers, "Content-Length": str(limit + 1)}
    )
    assert response.status_code == 413
    assert response.json() == {
        "detail": f"body must be at most {limit} bytes (setting max_ingest_bytes), "
        f"got Content-Length {limit + 1}"
    }

    async def chunks() -> Any:
        for _ in range(limit // 65536 + 2):
            yield b"\0" * 65536

    response = await client.post(INGEST, content=chunks(), headers=ingest_headers)
    assert response.status_code == 413
    assert response.json()["detail"].endswith(f"got more than {limit} bytes")
    response = await client.post(
        INGEST, content=b"x", headers={**ingest_headers, "Content-Type": "text/plain"}
    )
    assert response.status_code == 415
    assert response.json()["detail"].startswith("content-type: unsupported 'text/plain'")
    window = app.state.settings.ingest_dedup_window
    newest = binary(records(1), seq=window + 5, exporter_id="restarted")
    assert (await client.post(INGEST, content=newest, headers=ingest_headers)).status_code == 200
    response = await client.post(
        INGEST, content=binary(records(1), seq=0, exporter_id="restarted"), headers=ingest_headers
    )
    assert response.status_code == 409
    assert "below the de-duplication window" in response.json()["detail"]


async def test_roles_and_tenant_scope(
    app: FastAPI,
    client: httpx.AsyncClient,
    make_key: MakeKey,
    admin_headers: dict[str, str],
    slo: Any,
) -> None:
    body = binary(records(1))
    response = await client.post(INGEST, content=body, headers=BINARY)
    assert response.status_code == 401
    viewer = {**bearer(await make_key(KeyRole.VIEWER)), **BINARY}
    response = await client.post(INGEST, content=body, headers=viewer)
    assert response.status_code == 403
    assert response.json()["detail"].startswith(
        "this route needs role 'ingest' (allowed: admin, ingest)"
    )
    scoped = {**bearer(await make_key(KeyRole.INGEST, tenant="acme", name="acme-in")), **BINARY}
    other = binary(records(1, tenant="globex"), exporter_id="g")
    response = await client.post(INGEST, content=other, headers=scoped)
    assert response.status_code == 403
    assert response.json() == {
        "detail": "labels.tenant: this key is scoped to tenant 'acme'; the batch has records "
        "labelled 'globex'"
    }
    assert (await client.post(INGEST, content=body, headers=scoped)).status_code == 200
    admin = {**admin_headers, **BINARY}
    again = binary(records(1), seq=1)
    assert (await client.post(INGEST, content=again, headers=admin)).status_code == 200
    assert await requests_counted(app, client, admin_headers) == 2


async def test_ingest_counters_are_on_metrics(
    app: FastAPI, client: httpx.AsyncClient, ingest_headers: dict[str, str], slo: Any
) -> None:
    await client.post(INGEST, content=binary(records(2)), headers=ingest_headers)
    await client.post(INGEST, content=binary(records(2)), headers=ingest_headers)
    await client.post(INGEST, content=b"\xc1", headers=ingest_headers)
    text = (await client.get("/metrics")).text
    assert 'goodput_ingest_batches_total{outcome="applied",protocol="wire"} 1.0' in text
    assert 'goodput_ingest_batches_total{outcome="duplicate",protocol="wire"} 1.0' in text
    assert 'goodput_ingest_batches_total{outcome="rejected",protocol="wire"} 1.0' in text
    assert 'goodput_ingest_records_total{protocol="wire"} 2.0' in text
    assert 'goodput_requests_total{result="good",slo="chat",vantage="gateway"} 2.0' in text
    assert "process_cpu_seconds_total" in text
