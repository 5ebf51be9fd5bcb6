"""Hardening (issue 15): security headers on every response, no internal address in an
unauthenticated answer, Retry-After on 503, negative caching of unknown keys, rate limits on
failed authentication and per credential on the admin API."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from controlplane.main import create_app
from controlplane.services import keys as key_service
from controlplane.settings import Settings

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/health"), ("GET", "/api/v1/slos"), ("POST", "/api/v1/keys"), ("GET", "/nope")],
)
async def test_every_response_carries_the_security_headers(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await client.request(method, path)
    headers = response.headers
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "default-src 'self'" in headers["content-security-policy"]
    assert headers["cache-control"] == "no-store"
    assert "server" not in headers


async def test_the_new_key_response_is_never_cached(
    client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    response = await client.post(
        "/api/v1/keys", json={"name": "fresh", "role": "viewer"}, headers=admin_headers
    )
    assert response.status_code == 201, response.text
    assert response.headers["cache-control"] == "no-store"


async def test_ready_names_no_internal_address_and_503_says_when_to_retry() -> None:
    settings = Settings(
        database_url="postgresql+psycopg://nobody@10.99.88.77:6543/none", ready_timeout_s=0.5
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            response = await http.get("/ready")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert "10.99.88.77" not in response.text and "6543" not in response.text, response.text


async def test_unknown_keys_cost_one_query_per_prefix_and_ttl(
    app: FastAPI, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: every unknown key cost a database query (312 req/s sequentially)."""
    queries = 0
    real = key_service._live_with_prefix

    async def counting(*args: object, **kwargs: object) -> object:
        nonlocal queries
        queries += 1
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(key_service, "_live_with_prefix", counting)
    made_up = {"Authorization": f"Bearer {key_service.generate_key()}"}
    for _ in range(20):
        assert (await client.get("/api/v1/slos", headers=made_up)).status_code == 401
    assert queries == 1
    # A malformed key never reaches the database at all.
    malformed = {"Authorization": "Bearer gp_short"}
    assert (await client.get("/api/v1/slos", headers=malformed)).status_code == 401
    assert queries == 1


async def test_failed_authentication_is_rate_limited_per_address(database_url: str) -> None:
    app = create_app(
        Settings(database_url=database_url, auth_failure_burst=5, auth_failures_per_s=0.5)
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            statuses = [
                (await http.get("/api/v1/slos", headers={"Authorization": f"Bearer gp_{k}"}))
                for k in range(8)
            ]
    assert [r.status_code for r in statuses] == [401] * 5 + [429] * 3
    # ceil(time to the next token at 0.5/s): 2 s right after the burst, 1 s once the eight
    # requests took half a second or more (a busy machine).
    assert statuses[-1].headers["retry-after"] in {"1", "2"}
    assert statuses[-1].json() == {
        "detail": "too many failed authentications from this address; retry later"
    }


async def test_the_admin_api_is_rate_limited_per_credential(
    database_url: str, admin_headers: dict[str, str]
) -> None:
    app = create_app(Settings(database_url=database_url, admin_burst=3, admin_requests_per_s=1))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            statuses = [
                (await http.get("/api/v1/slos", headers=admin_headers)).status_code
                for _ in range(5)
            ]
            health = (await http.get("/health")).status_code
    assert statuses == [200, 200, 200, 429, 429]
    assert health == 200
