"""Every route × every role, read from the app itself: routes added later are covered too."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from controlplane.api.auth import route_requirements
from controlplane.main import create_app
from controlplane.models import KeyRole
from controlplane.settings import Settings

pytestmark = pytest.mark.integration

# The policy, written out independently of the implementation: who satisfies which role.
SATISFIES: dict[KeyRole, set[KeyRole]] = {
    KeyRole.VIEWER: {KeyRole.VIEWER},
    KeyRole.OPERATOR: {KeyRole.OPERATOR, KeyRole.VIEWER},
    KeyRole.ADMIN: set(KeyRole),
    KeyRole.INGEST: {KeyRole.INGEST},
    KeyRole.AGENT: {KeyRole.AGENT},
}
PLACEHOLDER = "00000000-0000-0000-0000-000000000000"  # valid for every path parameter type


def endpoints(app: FastAPI) -> list[tuple[str, str, APIRoute]]:
    found = []
    for route in app.routes:
        if isinstance(route, APIRoute):
            path = re.sub(r"\{[^}]+\}", PLACEHOLDER, route.path)
            found.extend((method, path, route) for method in sorted(route.methods))
    return found


def test_every_api_route_declares_a_role() -> None:
    app = create_app(Settings(database_url="sqlite:///unused.db"))
    routes = endpoints(app)
    assert len(routes) >= 16
    for method, path, route in routes:
        assert route_requirements(route), f"{method} {path} declares no role"


async def status_of(
    app: FastAPI, method: str, path: str, key: str | None
) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and (for non-streaming answers) body of one request, sent at the ASGI
    level: the call ends when the response has started, so a never-ending stream (SSE) is cut
    off instead of hanging the test."""
    body = b"{}" if method in ("POST", "PATCH", "PUT") else b""
    headers = [(b"content-type", b"application/json")]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1234),
        "state": {},
    }
    started = asyncio.Event()
    finished = asyncio.Event()
    answer: dict[str, Any] = {"body": b""}
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await started.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
            started.set()
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")
            if not message.get("more_body", False):
                finished.set()

    task = asyncio.create_task(app(scope, receive, send))
    done = asyncio.create_task(finished.wait())
    await asyncio.wait({task, done}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    if not finished.is_set():
        await asyncio.wait_for(started.wait(), timeout=10)  # streaming: the status is enough
    for pending in (task, done):
        pending.cancel()
    await asyncio.gather(task, done, return_exceptions=True)
    return answer["status"], answer["headers"], answer["body"]


async def test_every_route_against_every_role(app: FastAPI, make_key: Any) -> None:
    keys = {role: await make_key(role) for role in KeyRole}
    checked = 0
    for method, path, route in endpoints(app):
        (requirement,) = route_requirements(route)
        is_open = requirement.is_open(app.state.settings)
        status, headers, body = await status_of(app, method, path, None)
        if is_open:
            assert status not in (401, 403), (method, path)
        else:
            assert status == 401, (method, path, body)
            assert headers["www-authenticate"] == "Bearer"
        for role, key in keys.items():
            status, _, body = await status_of(app, method, path, key)
            allowed = is_open or requirement.role in SATISFIES[role]
            where = (method, path, role.value, status, body)
            if allowed:
                assert status not in (401, 403), where
                assert status < 500, where
            else:
                assert status == 403, where
                detail = json.loads(body)["detail"]
                assert f"this route needs role {requirement.role.value!r}" in detail, where
                assert f"has role {role.value!r}" in detail, where
            checked += 1
    assert checked >= 16 * len(KeyRole)


async def test_forbidden_message_names_needed_and_held_roles(
    client: httpx.AsyncClient, viewer_headers: dict[str, str]
) -> None:
    response = await client.post("/api/v1/slos", json={}, headers=viewer_headers)
    assert response.status_code == 403
    assert response.json() == {
        "detail": "this route needs role 'operator' (allowed: admin, operator); "
        "key 'test-viewer' has role 'viewer'"
    }


@pytest.mark.parametrize(
    ("authorization", "detail"),
    [
        (None, "missing API key: send 'Authorization: Bearer <key>'"),
        ("Basic dXNlcjpwYXNz", "missing API key: send 'Authorization: Bearer <key>'"),
        ("Bearer gp_not-a-key", "invalid API key: unknown or revoked"),
        ("Bearer gp_" + "A" * 43, "invalid API key: unknown or revoked"),
    ],
)
async def test_missing_or_unknown_key_is_401(
    client: httpx.AsyncClient, authorization: str | None, detail: str
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    response = await client.get("/api/v1/slos", headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {"detail": detail}


async def test_revoked_key_is_401_at_once(
    client: httpx.AsyncClient, admin_headers: dict[str, str]
) -> None:
    created = await client.post(
        "/api/v1/keys", json={"name": "temp", "role": "viewer"}, headers=admin_headers
    )
    key = created.json()
    headers = {"Authorization": f"Bearer {key['key']}"}
    assert (await client.get("/api/v1/slos", headers=headers)).status_code == 200
    revoked = await client.delete(f"/api/v1/keys/{key['id']}", headers=admin_headers)
    assert revoked.status_code == 204
    response = await client.get("/api/v1/slos", headers=headers)
    assert response.status_code == 401
    assert response.json() == {"detail": "invalid API key: unknown or revoked"}


@pytest.mark.parametrize("open_health", [True, False])
async def test_health_is_open_unless_configured(
    database_url: str, make_key: Any, open_health: bool
) -> None:
    app = create_app(Settings(database_url=database_url, open_health=open_health))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for path in ("/health", "/ready"):
                response = await client.get(path)
                assert response.status_code == (200 if open_health else 401), path
            viewer = {"Authorization": f"Bearer {await make_key(KeyRole.VIEWER)}"}
            assert (await client.get("/health", headers=viewer)).status_code == 200
            ingest = {"Authorization": f"Bearer {await make_key(KeyRole.INGEST)}"}
            expected = 200 if open_health else 403
            assert (await client.get("/health", headers=ingest)).status_code == expected
