"""API-key management: the key is shown once, stored hashed, listed by prefix, revocable."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from controlplane.models import APIKey

pytestmark = pytest.mark.integration

KEYS = "/api/v1/keys"


async def test_create_returns_the_key_once_and_stores_only_its_hash(
    app: FastAPI, client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    response = await client.post(
        KEYS, json={"name": "grafana", "role": "viewer"}, headers=admin_headers
    )
    assert response.status_code == 201
    created = response.json()
    key = created["key"]
    assert key.startswith("gp_")
    assert len(key) == 46
    assert created["prefix"] == key[:11]
    assert created["role"] == "viewer"
    async with app.state.sessions() as session:
        row = await session.scalar(sa.select(APIKey).where(APIKey.name == "grafana"))
    assert row is not None
    assert row.hash == hashlib.sha256(key.encode()).hexdigest()
    assert key not in repr(row.__dict__)
    listed = (await client.get(KEYS, headers=admin_headers)).json()
    assert all("key" not in k and "hash" not in k for k in listed["data"])
    read = (await client.get(f"{KEYS}/{created['id']}", headers=admin_headers)).json()
    assert "key" not in read


async def test_list_shows_prefix_role_and_last_use(
    client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    created = (
        await client.post(KEYS, json={"name": "bot", "role": "operator"}, headers=admin_headers)
    ).json()
    assert created["last_used_at"] is None
    await client.get("/api/v1/slos", headers={"Authorization": f"Bearer {created['key']}"})
    listed = (await client.get(f"{KEYS}?role=operator", headers=admin_headers)).json()
    assert listed["count"] == 1
    (entry,) = listed["data"]
    assert (entry["name"], entry["prefix"], entry["role"]) == ("bot", created["prefix"], "operator")
    assert entry["last_used_at"] is not None


async def test_revoke_hides_from_default_list_and_is_idempotent(
    client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    created = (
        await client.post(KEYS, json={"name": "old", "role": "ingest"}, headers=admin_headers)
    ).json()
    for _ in range(2):
        response = await client.delete(f"{KEYS}/{created['id']}", headers=admin_headers)
        assert response.status_code == 204
    names = [k["name"] for k in (await client.get(KEYS, headers=admin_headers)).json()["data"]]
    assert "old" not in names
    every = (await client.get(f"{KEYS}?include_revoked=true", headers=admin_headers)).json()
    (old,) = [k for k in every["data"] if k["name"] == "old"]
    assert old["revoked_at"] is not None
    audit = (await client.get("/api/v1/audit?action=key.revoke", headers=admin_headers)).json()
    assert audit["count"] == 1


async def test_unknown_key_id_is_404(
    client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    missing = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
    response = await client.delete(f"{KEYS}/{missing}", headers=admin_headers)
    assert response.status_code == 404
    assert response.json() == {"detail": f"API key {missing} not found"}


@pytest.mark.parametrize(
    ("body", "msg"),
    [
        (
            {"name": "x", "role": "root"},
            "role must be one of 'viewer', 'operator', 'admin', 'ingest' or 'agent', got 'root'",
        ),
        (
            {"name": "x", "role": "admin", "tenant": "acme"},
            "tenant is only allowed for roles ingest, operator, viewer; role 'admin' acts on "
            "every tenant, got tenant 'acme'",
        ),
    ],
)
async def test_invalid_key_requests_are_422(
    client: httpx.AsyncClient, admin_headers: dict[str, str], body: dict[str, Any], msg: str
) -> None:
    response = await client.post(KEYS, json=body, headers=admin_headers)
    assert response.status_code == 422
    assert [d["msg"] for d in response.json()["detail"]] == [msg]
