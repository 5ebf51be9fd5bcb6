"""The app-wide query rule: a parameter the route does not declare, or one given twice where
the route takes one value, is a 422 naming it (FastAPI alone would ignore or overwrite it)."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.integration


def only_error(response: httpx.Response) -> dict[str, object]:
    assert response.status_code == 422, response.text
    (entry,) = response.json()["detail"]
    assert isinstance(entry, dict)
    return entry


async def test_an_unknown_parameter_is_named_with_the_allowed_ones(
    client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    entry = only_error(await client.get("/api/v1/slos?limt=5", headers=admin_headers))
    assert entry == {
        "loc": ["query", "limt"],
        "field": "limt",
        "msg": "'limt' is not a query parameter of this route (allowed: include_deleted, "
        "limit, model, name_prefix, offset, tenant), got '5'",
        "type": "value_error",
    }


async def test_routes_without_parameters_refuse_any(
    client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    entry = only_error(await client.get("/health?probe=1"))
    assert entry["msg"] == "'probe' is not a query parameter of this route (allowed: none), got '1'"
    entry = only_error(await client.get("/api/v1/keys/x?=", headers=admin_headers))
    assert entry["loc"] == ["query", ""]


async def test_a_repeated_parameter_is_refused(
    client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    response = await client.get("/api/v1/slos?model=a&model=b", headers=admin_headers)
    assert only_error(response)["msg"] == "model must be given once, got 2 values"


async def test_declared_parameters_pass(
    client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    response = await client.get("/api/v1/slos?model=a&limit=5", headers=admin_headers)
    assert response.json() == {"data": [], "count": 0}
    assert (await client.get("/api/v1/goodput?window=5m", headers=admin_headers)).status_code == 200
