"""OpenSLO v1 over HTTP: export → import is the identity; threshold SLIs import; errors name
the document and field; an import is all or nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import yaml
from fastapi import FastAPI

from controlplane import openslo
from controlplane.errors import InvalidInputError

pytestmark = pytest.mark.integration

SLO = {
    "name": "chat",
    "description": "chat, premium tier",
    "selector": {"model": "llama", "tenant": "acme"},
    "objectives": [
        {"metric": "ttft", "threshold_s": 0.2},
        {"metric": "itl", "threshold_s": 0.05, "statistic": "p99.9"},
    ],
    "target": 0.995,
    "window_s": 604_800,
    "vantage": "engine",
    "availability_target": 0.999,
}
YAML = {"content-type": "application/yaml"}
COMPARED = (
    "name",
    "description",
    "selector",
    "objectives",
    "target",
    "window_s",
    "vantage",
    "availability_target",
)


async def test_export_then_import_round_trips(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    original = (await client.post("/api/v1/slos", json=SLO, headers=operator_headers)).json()
    exported = await client.get("/api/v1/slos/chat/openslo", headers=operator_headers)
    assert exported.status_code == 200
    assert exported.headers["content-type"].startswith("application/yaml")
    doc = yaml.safe_load(exported.text)
    assert doc["apiVersion"] == "openslo/v1"
    assert doc["spec"]["timeWindow"] == [{"duration": "7d", "isRolling": True}]
    assert doc["spec"]["objectives"] == [{"displayName": "good requests", "target": 0.995}]
    assert doc["spec"]["indicator"]["spec"]["ratioMetric"]["good"]["metricSource"]["type"] == (
        "Goodput"
    )

    await client.delete("/api/v1/slos/chat", headers=operator_headers)
    imported = await client.post(
        "/api/v1/slos:import", content=exported.text, headers={**operator_headers, **YAML}
    )
    assert imported.status_code == 200, imported.text
    (applied,) = imported.json()["data"]
    assert applied["action"] == "created"
    assert applied["slo"]["id"] != original["id"]
    assert {k: applied["slo"][k] for k in COMPARED} == {k: original[k] for k in COMPARED}

    again = await client.post(
        "/api/v1/slos:import", content=exported.text, headers={**operator_headers, **YAML}
    )
    assert again.json()["data"][0]["action"] == "unchanged"


THRESHOLD_SLO = """
apiVersion: openslo/v1
kind: SLO
metadata: {name: ttft-fast}
spec:
  service: llama
  budgetingMethod: Occurrences
  timeWindow: [{duration: 30d, isRolling: true}]
  indicator:
    metadata: {name: ttft}
    spec:
      thresholdMetric:
        metricSource:
          type: Goodput
          spec: {metric: ttft, selector: {model: llama}}
  objectives:
    - {displayName: fast first token, op: lte, value: 0.3, target: 0.9}
---
name: native
objectives: [{metric: e2el, threshold_s: 10}]
target: 0.5
"""


async def test_threshold_sli_and_native_documents_import(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    response = await client.post(
        "/api/v1/slos:import", content=THRESHOLD_SLO, headers={**operator_headers, **YAML}
    )
    assert response.status_code == 200, response.text
    slos = {a["slo"]["name"]: a["slo"] for a in response.json()["data"]}
    assert slos["ttft-fast"]["objectives"] == [
        {"metric": "ttft", "threshold_s": 0.3, "statistic": "max"}
    ]
    assert (slos["ttft-fast"]["target"], slos["ttft-fast"]["window_s"]) == (0.9, 30 * 86_400)
    assert slos["ttft-fast"]["selector"] == {"model": "llama"}
    assert slos["native"]["window_s"] == 28 * 86_400


@pytest.mark.parametrize(
    ("text", "field", "msg"),
    [
        (
            THRESHOLD_SLO.replace("Occurrences", "Timeslices"),
            "documents[0].spec.budgetingMethod",
            "documents[0].spec.budgetingMethod must be one of ['Occurrences'], got 'Timeslices'",
        ),
        (
            THRESHOLD_SLO.replace("30d", "1M"),
            "documents[0].spec.timeWindow[0].duration",
            "documents[0].spec.timeWindow[0].duration must be a rolling duration like '28d', "
            "'12h', '30m' or '3600s' (calendar units M, Q, Y are not supported), got '1M'",
        ),
        (
            THRESHOLD_SLO.replace("target: 0.5", "target: 5"),
            "documents[1].target",
            "documents[1].target must be in (0, 1), got 5",
        ),
        ("a: [", "body", None),
        ("x: &a [1]\ny: *a\n", "body", "YAML aliases (*name) are not allowed in an import"),
        ("[" * 40 + "]" * 40, "body", "YAML nests deeper than 32 levels"),
        ("[" * 50_000, "body", None),  # libyaml's own nesting limit (1,000) comes first
    ],
)
async def test_invalid_import_names_document_and_field_and_writes_nothing(
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    text: str,
    field: str,
    msg: str | None,
) -> None:
    response = await client.post(
        "/api/v1/slos:import", content=text, headers={**operator_headers, **YAML}
    )
    assert response.status_code == 422
    (detail,) = response.json()["detail"]
    assert detail["field"] == field
    if msg is None:
        assert detail["msg"].startswith("body is not valid YAML: ")
    else:
        assert detail["msg"] == msg
    listed = (await client.get("/api/v1/slos", headers=operator_headers)).json()
    assert listed["count"] == 0


async def test_import_needs_yaml_content_type(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    response = await client.post("/api/v1/slos:import", json={}, headers=operator_headers)
    assert response.status_code == 415
    assert response.json() == {
        "detail": "content-type must be one of ['application/yaml', 'application/x-yaml', "
        "'text/yaml'], got 'application/json'"
    }


async def test_deep_yaml_never_blocks_the_event_loop(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    """Regression: 4,000 bytes of nested ``[`` took 10.8 s on the event loop (``/health``
    did not answer); 50,000 bytes did not finish within 60 s."""
    started = time.monotonic()
    response, health = await asyncio.gather(
        client.post(
            "/api/v1/slos:import", content="[" * 50_000, headers={**operator_headers, **YAML}
        ),
        client.get("/health"),
    )
    assert (response.status_code, health.status_code) == (422, 200)
    assert time.monotonic() - started < 2.0


def test_the_parse_budget_bounds_a_slow_parse() -> None:
    text = "- {a: 1}\n" * 20_000
    with pytest.raises(InvalidInputError) as exc:
        openslo.parse_documents(text, budget_s=0.0)
    assert exc.value.message == "YAML took more than 0 s to parse"


async def test_a_chunked_import_body_is_refused_while_streaming(
    client: httpx.AsyncClient, operator_headers: dict[str, str], app: FastAPI
) -> None:
    """Regression: ``slos:import`` read a chunked body whole before its 1 MiB check."""
    limit = app.state.settings.max_import_bytes
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(200):  # 200 MiB if it were read whole
            sent += 1 << 20
            yield b"#" * (1 << 20)

    response = await client.post(
        "/api/v1/slos:import", content=chunks(), headers={**operator_headers, **YAML}
    )
    assert response.status_code == 413
    assert response.json() == {
        "detail": f"body must be at most {limit} bytes (setting max_import_bytes), "
        f"got more than {limit} bytes"
    }
    assert sent <= 3 << 20
