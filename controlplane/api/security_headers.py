"""Security headers on every response, and ``Retry-After`` on every 503.

:class:`SecurityHeaders` is a pure ASGI middleware: it edits ``http.response.start`` only,
so streamed responses (SSE) pass through untouched. Every response gets:

* ``X-Content-Type-Options: nosniff`` (no MIME sniffing of a JSON body into HTML);
* ``X-Frame-Options: DENY`` and ``Content-Security-Policy`` with ``frame-ancestors 'none'``
  (no framing, so no clickjacking of the console); the policy is ``default-src 'self'``:
  the console's same-origin scripts, styles and API calls work, nothing else loads. The
  OpenAPI pages (``/docs``, ``/redoc``) load their viewer from a CDN, so they get only
  ``frame-ancestors 'none'``;
* ``Referrer-Policy: no-referrer``;
* ``Cache-Control: no-store`` unless the app set its own (API answers, and above all the
  one that shows a new key's secret, must never sit in a cache);
* ``Retry-After: 1`` on a 503 that does not say when to retry.

The ``Server`` header is not sent (``goodput controlplane serve`` runs uvicorn with
``server_header=False``; a ``server`` header set by the app is dropped here).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["CONTENT_SECURITY_POLICY", "SecurityHeaders"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
_DOCS_POLICY = "frame-ancestors 'none'"
_DOCS_PATHS = ("/docs", "/redoc")
_FIXED: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeaders:
    """The middleware (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        docs = scope["path"].startswith(_DOCS_PATHS)
        policy = (_DOCS_POLICY if docs else CONTENT_SECURITY_POLICY).encode()

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"server"]
                present = {k.lower() for k, _ in headers}
                headers.extend(h for h in _FIXED if h[0] not in present)
                if b"content-security-policy" not in present:
                    headers.append((b"content-security-policy", policy))
                if b"cache-control" not in present:
                    headers.append((b"cache-control", b"no-store"))
                if message["status"] == 503 and b"retry-after" not in present:
                    headers.append((b"retry-after", b"1"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)
