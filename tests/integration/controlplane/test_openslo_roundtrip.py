"""OpenSLO v1 over HTTP: export → import is the identity; threshold SLIs import; errors name
the document and field; an import is all or nothing."""

from __future__ import annotations

import httpx
import pytest
import yaml

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
