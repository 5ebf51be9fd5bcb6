"""Console sessions without a database: only the token's SHA-256 is stored, the expiry is
the sign-in time plus the TTL, one-time links carry no CSRF token, the CSRF comparison,
the cookie's attributes, and the sign-in form's same-site and redirect checks."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from starlette.requests import Request

from controlplane.api.sessions import (
    SAFE_METHODS,
    OpenSession,
    cookie_options,
    sign_in,
    sign_in_link,
)
from controlplane.console.pages import _safe_next, _same_origin
from controlplane.models import ConsoleSession, KeyRole
from controlplane.services.keys import AuthenticatedKey

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
T = TypeVar("T")
KEY = AuthenticatedKey(uuid.uuid4(), "ops", KeyRole.OPERATOR, None, "gp_abc", "h", None)


class RecordingSession:
    """Stands in for an AsyncSession: keeps what is added."""

    def __init__(self) -> None:
        self.added: list[Any] = []

    def add(self, row: Any) -> None:
        self.added.append(row)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run on a thread of its own: the browser tests' event loop may be running here."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _request(headers: dict[str, str], scheme: str = "http") -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {
        "type": "http",
        "method": "POST",
        "scheme": scheme,
        "server": ("console.example", 8000),
        "path": "/console/sign-in",
        "headers": [(b"host", b"console.example:8000"), *raw],
    }
    return Request(scope)


def test_sign_in_stores_only_the_tokens_hash_and_expires_after_the_ttl() -> None:
    db = RecordingSession()
    token, opened = run(sign_in(db, KEY, now=NOW, ttl_s=3600))  # type: ignore[arg-type]
    row = next(r for r in db.added if isinstance(r, ConsoleSession))
    assert row.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert token not in {str(v) for v in vars(row).values()}
    assert row.expires_at == opened.expires_at == NOW + timedelta(hours=1)
    assert row.csrf_token == opened.csrf_token and len(opened.csrf_token) >= 32
    assert (opened.id, opened.role) == (KEY.id, KeyRole.OPERATOR)
    audits = [r for r in db.added if not isinstance(r, ConsoleSession)]
    assert [a.action for a in audits] == ["session.create"]


def test_two_sign_ins_get_different_tokens_and_csrf_tokens() -> None:
    first = run(sign_in(RecordingSession(), KEY, now=NOW, ttl_s=60))  # type: ignore[arg-type]
    second = run(sign_in(RecordingSession(), KEY, now=NOW, ttl_s=60))  # type: ignore[arg-type]
    assert first[0] != second[0]
    assert first[1].csrf_token != second[1].csrf_token


def test_a_one_time_link_has_no_csrf_token_so_it_never_passes_as_a_session() -> None:
    db = RecordingSession()
    link = run(sign_in_link(db, KEY, now=NOW, ttl_s=600))  # type: ignore[arg-type]
    (row,) = db.added
    assert row.csrf_token == ""
    assert row.token_hash == hashlib.sha256(link.encode()).hexdigest()
    assert row.expires_at == NOW + timedelta(minutes=10)


def test_csrf_matches_only_the_sessions_own_token() -> None:
    opened = OpenSession(KEY.id, "ops", KeyRole.OPERATOR, None, "t0k3n", NOW)
    assert opened.csrf_matches("t0k3n")
    assert not opened.csrf_matches(None)
    assert not opened.csrf_matches("")
    assert not opened.csrf_matches("t0k3n ")
    assert {"GET", "HEAD", "OPTIONS"} == SAFE_METHODS  # every other method needs the token


def test_cookie_is_http_only_strict_and_secure_over_https() -> None:
    plain = cookie_options(_request({}), 28800)
    assert plain == {
        "max_age": 28800,
        "httponly": True,
        "samesite": "strict",
        "secure": False,
        "path": "/",
    }
    assert cookie_options(_request({}, scheme="https"), 60)["secure"] is True


def test_sign_in_form_accepts_only_its_own_site() -> None:
    assert _same_origin(_request({}))  # no header: not a cross-site browser post
    assert _same_origin(_request({"Origin": "http://console.example:8000"}))
    assert not _same_origin(_request({"Origin": "http://evil.example"}))
    assert not _same_origin(_request({"Origin": "null"}))
    # Sec-Fetch-Site decides when the browser sends it (Origin is null under no-referrer).
    assert _same_origin(_request({"Sec-Fetch-Site": "same-origin", "Origin": "null"}))
    assert not _same_origin(
        _request({"Sec-Fetch-Site": "cross-site", "Origin": "http://console.example:8000"})
    )
    assert not _same_origin(_request({"Sec-Fetch-Site": "same-site"}))


def test_after_sign_in_only_a_console_path() -> None:
    assert _safe_next("/console/fleet?x=1") == "/console/fleet?x=1"
    for value in ("https://evil.example/console/", "//evil.example/console/", "/api/v1/keys", ""):
        assert _safe_next(value) == "/console/"
