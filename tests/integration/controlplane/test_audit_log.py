"""Every mutation leaves one audit entry (actor, action, target, before/after), in the same
transaction: a failed mutation leaves none."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.integration

SLO = {"name": "chat", "objectives": [{"metric": "ttft", "threshold_s": 0.2}], "target": 0.99}


async def entries(client: httpx.AsyncClient, headers: dict[str, str], query: str = "") -> list:
    response = await client.get(f"/api/v1/audit?{query}", headers=headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["count"] == len(body["data"]) or "limit" in query
    return body["data"]


async def test_slo_lifecycle_is_audited_with_before_and_after(
    client: httpx.AsyncClient, admin_headers: dict[str, str], operator_headers: dict[str, str]
) -> None:
    created = (await client.post("/api/v1/slos", json=SLO, headers=operator_headers)).json()
    await client.patch("/api/v1/slos/chat", json={"target": 0.9}, headers=operator_headers)
    await client.delete("/api/v1/slos/chat", headers=operator_headers)
    log = await entries(client, admin_headers, f"target_type=slo&target_id={created['id']}")
    assert [e["action"] for e in log] == ["slo.delete", "slo.update", "slo.create"]
    delete, update, create = log
    assert create["before"] is None
    assert create["after"]["name"] == "chat"
    assert (update["before"]["target"], update["after"]["target"]) == (0.99, 0.9)
    assert delete["before"]["deleted_at"] is None
    assert delete["after"]["deleted_at"] is not None
    assert all(e["actor"].startswith("key:") and e["actor"].endswith(":test-operator") for e in log)


async def test_failed_mutation_leaves_no_entry(
    client: httpx.AsyncClient, admin_headers: dict[str, str], operator_headers: dict[str, str]
) -> None:
    await client.post("/api/v1/slos", json=SLO, headers=operator_headers)
    conflict = await client.post("/api/v1/slos", json=SLO, headers=operator_headers)
    assert conflict.status_code == 409
    assert len(await entries(client, admin_headers, "action=slo.create")) == 1


async def test_reads_write_nothing(
    client: httpx.AsyncClient, admin_headers: dict[str, str], viewer_headers: dict[str, str]
) -> None:
    before = await entries(client, admin_headers)
    await client.get("/api/v1/slos", headers=viewer_headers)
    await client.get("/api/v1/fleet", headers=viewer_headers)
    assert await entries(client, admin_headers) == before


async def test_filters_and_pagination(
    client: httpx.AsyncClient, admin_headers: dict[str, str], operator_headers: dict[str, str]
) -> None:
    for name in ("a", "b", "c"):
        await client.post("/api/v1/slos", json={**SLO, "name": name}, headers=operator_headers)
    page = await client.get(
        "/api/v1/audit?action=slo.create&limit=2&offset=1", headers=admin_headers
    )
    body = page.json()
    assert body["count"] == 3
    assert [e["after"]["name"] for e in body["data"]] == ["b", "a"]
    operator_id = body["data"][0]["actor"].split(":")[1]
    by_actor = await entries(client, admin_headers, f"actor=key:{operator_id}")
    assert len(by_actor) == 3
    future = await entries(client, admin_headers, "since=2999-01-01T00:00:00Z")
    assert future == []


async def test_bad_filter_is_422(client: httpx.AsyncClient, admin_headers: dict[str, str]) -> None:
    response = await client.get("/api/v1/audit?action=DROP TABLE", headers=admin_headers)
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "action"


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("since=0001-01-01T00:00:00%2B14:00", 422),  # before year 1 in UTC
        ("until=9999-12-31T23:59:59-14:00", 422),  # after year 9999 in UTC
        ("since=0001-01-01T00:00:00Z", 200),
        ("until=9999-12-31T23:59:59%2B14:00", 200),
    ],
)
async def test_extreme_datetimes_are_answered_never_a_500(
    client: httpx.AsyncClient, admin_headers: dict[str, str], query: str, status: int
) -> None:
    """Regression: ``since=0001-01-01T00:00:00+14:00`` was a 500."""
    response = await client.get(f"/api/v1/audit?{query}", headers=admin_headers)
    assert response.status_code == status, response.text
    if status == 422:
        name, value = query.split("=")
        assert response.json()["detail"][0]["msg"] == (
            f"{name} must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z once in "
            f"UTC, got {value.replace('%2B', '+')!r}"
        )
