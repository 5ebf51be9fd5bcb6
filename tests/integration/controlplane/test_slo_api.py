"""SLO registry over HTTP on both backends: CRUD, versions, soft delete, filters, validation."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration

SLOS = "/api/v1/slos"


def chat(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "chat",
        "description": "interactive chat",
        "selector": {"model": "llama", "tenant": "acme"},
        "objectives": [
            {"metric": "ttft", "threshold_s": 0.2},
            {"metric": "itl", "threshold_s": 0.05, "statistic": "p99"},
        ],
        "target": 0.99,
        "window_s": 2_419_200,
    }
    body.update(overrides)
    return body


async def create(client: httpx.AsyncClient, headers: dict[str, str], **overrides: Any) -> Any:
    response = await client.post(SLOS, json=chat(**overrides), headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


async def test_create_returns_the_slo_with_defaults(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    slo = await create(client, operator_headers)
    assert slo["name"] == "chat"
    assert slo["version"] == 1
    assert slo["vantage"] == "gateway"
    assert slo["availability_target"] is None
    assert slo["deleted_at"] is None
    assert slo["selector"] == {"model": "llama", "tenant": "acme"}
    assert slo["objectives"] == [
        {"metric": "ttft", "threshold_s": 0.2, "statistic": "max"},
        {"metric": "itl", "threshold_s": 0.05, "statistic": "p99"},
    ]


async def test_an_objective_the_vantage_cannot_measure_is_flagged_on_every_write(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    assert (await create(client, operator_headers))["warnings"] == []  # gateway: all measured
    slo = await create(client, operator_headers, name="engine-chat", vantage="engine")
    (warning,) = slo["warnings"]
    assert warning == (
        "objective 'itl_p99' (itl p99 <= 0.05 s) cannot be measured on vLLM's engine-side "
        "records (stat-logger plugin, OTLP llm_request spans: first and last token only); "
        "those requests are judged on the other objectives and counted as unmeasured "
        "(measured_ratio); judge ITL at vantage 'gateway'"
    )
    patched = await client.patch(
        f"{SLOS}/engine-chat", json={"target": 0.95}, headers=operator_headers
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["warnings"] == [warning]
    patched = await client.patch(
        f"{SLOS}/engine-chat",
        json={"objectives": [{"metric": "ttft", "threshold_s": 0.2}]},
        headers=operator_headers,
    )
    assert patched.json()["warnings"] == []
    # Warnings are derived from the definition on every read, never stored with it.
    versions = await client.get(f"{SLOS}/engine-chat/versions", headers=operator_headers)
    assert [v["snapshot"]["warnings"] for v in versions.json()["data"]] == [
        [],
        [warning],
        [warning],
    ]


async def test_read_by_id_and_by_name(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    slo = await create(client, operator_headers)
    by_id = await client.get(f"{SLOS}/{slo['id']}", headers=operator_headers)
    by_name = await client.get(f"{SLOS}/chat", headers=operator_headers)
    assert by_id.status_code == by_name.status_code == 200
    assert by_id.json() == by_name.json() == slo


async def test_unknown_slo_is_404_naming_the_reference(
    client: httpx.AsyncClient, viewer_headers: dict[str, str]
) -> None:
    response = await client.get(f"{SLOS}/nope", headers=viewer_headers)
    assert response.status_code == 404
    assert response.json() == {"detail": "SLO with name 'nope' not found"}
    missing = "00000000-0000-0000-0000-000000000001"
    response = await client.get(f"{SLOS}/{missing}", headers=viewer_headers)
    assert response.json() == {"detail": f"SLO with id '{missing}' not found"}


async def test_duplicate_live_name_is_409(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    slo = await create(client, operator_headers)
    response = await client.post(SLOS, json=chat(), headers=operator_headers)
    assert response.status_code == 409
    assert response.json() == {"detail": f"an SLO named 'chat' already exists (id {slo['id']})"}


async def test_patch_changes_only_sent_fields_and_bumps_version(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    slo = await create(client, operator_headers)
    response = await client.patch(
        f"{SLOS}/chat",
        json={"target": 0.95, "availability_target": 0.999},
        headers=operator_headers,
    )
    assert response.status_code == 200, response.text
    updated = response.json()
    assert updated["version"] == 2
    assert updated["target"] == 0.95
    assert updated["availability_target"] == 0.999
    assert updated["objectives"] == slo["objectives"]
    assert updated["description"] == slo["description"]
    assert updated["updated_at"] > slo["updated_at"]


async def test_patch_without_changes_writes_no_version(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    await create(client, operator_headers)
    response = await client.patch(f"{SLOS}/chat", json={"target": 0.99}, headers=operator_headers)
    assert response.json()["version"] == 1
    versions = await client.get(f"{SLOS}/chat/versions", headers=operator_headers)
    assert versions.json()["count"] == 1


async def test_patch_null_for_required_field_is_422(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    await create(client, operator_headers)
    response = await client.patch(f"{SLOS}/chat", json={"target": None}, headers=operator_headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["msg"] == (
        "target must not be null (omit the field to keep its current value), got None"
    )


async def test_rename_to_a_taken_name_is_409(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    await create(client, operator_headers)
    other = await create(client, operator_headers, name="batch")
    response = await client.patch(
        f"{SLOS}/{other['id']}", json={"name": "chat"}, headers=operator_headers
    )
    assert response.status_code == 409
    assert response.json()["detail"].startswith("an SLO named 'chat' already exists")


async def test_version_history_is_newest_first_with_snapshots_and_actor(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    await create(client, operator_headers)
    await client.patch(f"{SLOS}/chat", json={"target": 0.9}, headers=operator_headers)
    await client.delete(f"{SLOS}/chat", headers=operator_headers)
    slo = (await client.get(f"{SLOS}/chat?include_deleted=true", headers=operator_headers)).json()
    response = await client.get(f"{SLOS}/{slo['id']}/versions", headers=operator_headers)
    history = response.json()
    assert history["count"] == 3
    assert [v["version"] for v in history["data"]] == [3, 2, 1]
    assert [v["snapshot"]["target"] for v in history["data"]] == [0.9, 0.9, 0.99]
    assert history["data"][0]["snapshot"]["deleted_at"] is not None
    assert history["data"][2]["actor"].endswith(":test-operator")


async def test_soft_delete_hides_the_slo_and_frees_its_name(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    old = await create(client, operator_headers)
    response = await client.delete(f"{SLOS}/chat", headers=operator_headers)
    assert response.status_code == 204
    assert (await client.get(f"{SLOS}/chat", headers=operator_headers)).status_code == 404
    again = await client.delete(f"{SLOS}/chat", headers=operator_headers)
    assert again.status_code == 404
    kept = await client.get(f"{SLOS}/{old['id']}?include_deleted=true", headers=operator_headers)
    assert kept.json()["deleted_at"] is not None
    new = await create(client, operator_headers)
    assert new["id"] != old["id"]
    assert new["version"] == 1
    live = await client.get(f"{SLOS}/chat", headers=operator_headers)
    assert live.json()["id"] == new["id"]


async def test_list_filters_and_paginates(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    await create(client, operator_headers, name="chat-a")
    await create(client, operator_headers, name="chat-b", selector={"model": "mistral"})
    await create(client, operator_headers, name="batch", selector={"tenant": "zeta"})
    await client.delete(f"{SLOS}/chat-b", headers=operator_headers)

    async def names(query: str) -> tuple[list[str], int]:
        body = (await client.get(f"{SLOS}?{query}", headers=operator_headers)).json()
        return [s["name"] for s in body["data"]], body["count"]

    assert await names("") == (["batch", "chat-a"], 2)
    assert await names("include_deleted=true") == (["batch", "chat-a", "chat-b"], 3)
    assert await names("name_prefix=chat&include_deleted=true") == (["chat-a", "chat-b"], 2)
    assert await names("model=mistral&include_deleted=true") == (["chat-b"], 1)
    assert await names("tenant=zeta") == (["batch"], 1)
    assert await names("limit=1&offset=1") == (["chat-a"], 2)


async def test_name_prefix_treats_like_wildcards_literally(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    await create(client, operator_headers, name="a_b")
    await create(client, operator_headers, name="axb")
    body = (await client.get(f"{SLOS}?name_prefix=a_", headers=operator_headers)).json()
    assert [s["name"] for s in body["data"]] == ["a_b"]


@pytest.mark.parametrize(
    ("overrides", "field", "msg"),
    [
        ({"target": 1.5}, "target", "target must be in (0, 1), got 1.5"),
        ({"target": 0}, "target", "target must be in (0, 1), got 0"),
        ({"window_s": 10}, "window_s", "window_s must be in [60, 31622400], got 10"),
        (
            {"name": "Chat"},
            "name",
            "name must match ^[a-z0-9][a-z0-9._-]*$, got 'Chat'",
        ),
        (
            {"name": "7c9e6679-7425-40de-944b-e07fc1f90ae7"},
            "name",
            "name must not be a UUID (UUIDs address SLOs by id), "
            "got '7c9e6679-7425-40de-944b-e07fc1f90ae7'",
        ),
        (
            {"selector": {"region": "eu"}},
            "selector.region",
            "selector.region is not an allowed field, got 'eu'",
        ),
        (
            {"objectives": [{"metric": "tbt", "threshold_s": 0.1}]},
            "objectives[0].metric",
            "objectives[0].metric must be one of 'ttft', 'tpot', 'e2el', 'itl', got 'tbt'",
        ),
        (
            {"objectives": [{"metric": "ttft", "threshold_s": 0.1, "statistic": "p99"}]},
            "objectives[0].statistic",
            "objectives[0].statistic must be one of 'max', got 'p99'",
        ),
        (
            {"objectives": [{"metric": "itl", "threshold_s": -1}]},
            "objectives[0].threshold_s",
            "objectives[0].threshold_s must be in (0, 3600], got -1",
        ),
        (
            {"objectives": [{"metric": "e2el", "threshold_s": 1}] * 17},
            "objectives",
            "objectives must have at most 16 item(s)",
        ),
        (
            {"vantage": "client"},
            "vantage",
            "vantage must be one of 'gateway' or 'engine', got 'client'",
        ),
        ({"colour": "red"}, "colour", "colour is not an allowed field, got 'red'"),
        (
            {"description": "a\u0000b"},
            "description",
            "description must match ^[^\\x00]*$, got 'a\\x00b'",
        ),
    ],
)
async def test_validation_errors_name_field_range_and_value(
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    overrides: dict[str, Any],
    field: str,
    msg: str,
) -> None:
    response = await client.post(SLOS, json=chat(**overrides), headers=operator_headers)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert [(d["field"], d["msg"]) for d in detail] == [(field, msg)]


async def test_missing_fields_are_listed(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    response = await client.post(SLOS, json={"name": "x"}, headers=operator_headers)
    assert response.status_code == 422
    assert [d["msg"] for d in response.json()["detail"]] == [
        "objectives is required",
        "target is required",
    ]


async def test_malformed_json_is_422(
    client: httpx.AsyncClient, operator_headers: dict[str, str]
) -> None:
    response = await client.post(
        SLOS,
        content=b'{"name": ',
        headers={**operator_headers, "content-type": "application/json"},
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"


async def test_bad_query_parameters_are_422(
    client: httpx.AsyncClient, viewer_headers: dict[str, str]
) -> None:
    response = await client.get(f"{SLOS}?limit=0", headers=viewer_headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["msg"] == "limit must be >= 1, got '0'"


async def test_tenant_scoped_key_sees_and_writes_only_its_tenant(
    client: httpx.AsyncClient, operator_headers: dict[str, str], make_key: Any
) -> None:
    await create(client, operator_headers, name="acme-chat", selector={"tenant": "acme"})
    await create(client, operator_headers, name="zeta-chat", selector={"tenant": "zeta"})
    scoped = {"Authorization": f"Bearer {await make_key('operator', tenant='acme')}"}
    listed = (await client.get(SLOS, headers=scoped)).json()
    assert [s["name"] for s in listed["data"]] == ["acme-chat"]
    assert (await client.get(f"{SLOS}/zeta-chat", headers=scoped)).status_code == 404
    response = await client.post(
        SLOS, json=chat(name="x", selector={"tenant": "zeta"}), headers=scoped
    )
    assert response.status_code == 403
    assert response.json() == {
        "detail": "this key is scoped to tenant 'acme': selector.tenant must be 'acme', got 'zeta'"
    }
