"""The SLO's ``infeasible`` field over HTTP on both backends: default, create, patch, the
version history, OpenSLO export and import, refusal of a bad value, and the engine's view."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI

from controlplane.policies.admission import AdmissionConfig, compute_policy
from controlplane.policies.learning import DEFAULT_PRIOR
from controlplane.services.slos import live_specs

pytestmark = pytest.mark.integration

SLOS = "/api/v1/slos"
YAML = {"content-type": "application/yaml"}


def chat(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "chat",
        "selector": {"slo": "chat"},
        "objectives": [{"metric": "ttft", "threshold_s": 0.5}],
        "target": 0.9,
        "window_s": 86_400,
    }
    body.update(overrides)
    return body


async def test_defaults_to_admit_and_patches_to_reject(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    created = await client.post(SLOS, json=chat(), headers=operator_headers)
    assert created.status_code == 201, created.text
    assert created.json()["infeasible"] == "admit"
    patched = await client.patch(
        f"{SLOS}/chat", json={"infeasible": "reject"}, headers=operator_headers
    )
    assert patched.status_code == 200, patched.text
    assert (patched.json()["infeasible"], patched.json()["version"]) == ("reject", 2)
    same = await client.patch(
        f"{SLOS}/chat", json={"infeasible": "reject"}, headers=operator_headers
    )
    assert same.json()["version"] == 2  # nothing changed, nothing written
    versions = await client.get(f"{SLOS}/chat/versions", headers=operator_headers)
    assert [v["snapshot"]["infeasible"] for v in versions.json()["data"]] == ["reject", "admit"]
    fetched = await client.get(f"{SLOS}/chat", headers=operator_headers)
    assert fetched.json()["infeasible"] == "reject"


async def test_reaches_the_engine_spec_and_the_admission_policy(
    app: FastAPI, client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    created = await client.post(SLOS, json=chat(infeasible="reject"), headers=operator_headers)
    assert created.status_code == 201, created.text
    async with app.state.sessions() as session:
        (spec,) = [s for s in await live_specs(session) if s.name == "chat"]
    assert spec.infeasible == "reject"
    policy = compute_policy(DEFAULT_PRIOR, [spec], {}, AdmissionConfig(), version=1)
    assert policy.slos["chat"].infeasible == "reject"
    assert policy.to_json()["slos"]["chat"]["infeasible"] == "reject"


@pytest.mark.parametrize(
    ("method", "path"), [("post", SLOS), ("patch", f"{SLOS}/chat")], ids=["create", "patch"]
)
async def test_a_bad_value_is_422_naming_the_field_and_the_allowed_values(
    client: httpx.AsyncClient, operator_headers: dict[str, str], method: str, path: str
) -> None:
    if method == "patch":
        await client.post(SLOS, json=chat(), headers=operator_headers)
    body = chat(infeasible="drop") if method == "post" else {"infeasible": "drop"}
    response = await client.request(method, path, json=body, headers=operator_headers)
    assert response.status_code == 422
    (detail,) = response.json()["detail"]
    assert detail["field"] == "infeasible"
    assert "'admit'" in detail["msg"] and "'reject'" in detail["msg"] and "drop" in detail["msg"]
    null = await client.patch(f"{SLOS}/chat", json={"infeasible": None}, headers=operator_headers)
    assert null.status_code in (404, 422)


async def test_openslo_export_and_import_carry_it(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    await client.post(SLOS, json=chat(infeasible="reject"), headers=operator_headers)
    await client.post(SLOS, json=chat(name="plain", selector={}), headers=operator_headers)
    exported = await client.get(f"{SLOS}/chat/openslo", headers=operator_headers)
    assert exported.status_code == 200, exported.text
    doc = yaml.safe_load(exported.text)
    assert doc["metadata"]["annotations"]["goodput.dev/infeasible"] == "reject"
    plain = yaml.safe_load(
        (await client.get(f"{SLOS}/plain/openslo", headers=operator_headers)).text
    )
    assert "goodput.dev/infeasible" not in plain["metadata"]["annotations"]  # as before

    await client.delete(f"{SLOS}/chat", headers=operator_headers)
    imported = await client.post(
        f"{SLOS}:import", content=exported.text, headers={**operator_headers, **YAML}
    )
    assert imported.status_code == 200, imported.text
    (applied,) = imported.json()["data"]
    assert (applied["action"], applied["slo"]["infeasible"]) == ("created", "reject")
