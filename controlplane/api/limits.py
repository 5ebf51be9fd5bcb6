"""Limits before work: what a request may cost is bounded before the app spends it.

:class:`RequestLimits` is a pure ASGI middleware (no buffering, SSE untouched). Per HTTP
request, in this order:

1. **Headers**: more than ``max_header_bytes`` of request headers (names and values) is a
   431, before anything else runs.
2. **Authentication before the body**: for a request that carries a body (``POST``,
   ``PUT``, ``PATCH``) to a guarded route, the route's role requirements
   (:mod:`controlplane.api.auth`) run *before* the body is read: a caller without a valid
   key gets its 401 (or 403) without the server reading, parsing or validating a byte of
   the body. The principal is kept in the scope, so the route's own dependency does not
   authenticate twice.
3. **Body size, while streaming**: each route has a limit (:func:`body_limit`:
   ``max_ingest_bytes`` for ingest and OTLP, ``max_import_bytes`` for ``slos:import``,
   ``max_request_bytes`` for every other route). A declared ``Content-Length`` over it is a
   413 at once; a chunked body is counted as it arrives and refused with a 413 as soon as
   it passes the limit, so no body is ever held whole beyond its limit.
4. **Time**: a handler that has not started its response within ``request_timeout_s`` is
   cancelled and answered 503 with ``Retry-After``. Once the response has started
   (streams, SSE) the bound no longer applies: a stream ends with the server's shutdown.

Errors have the app's shape (``{"detail": ...}``), with ``WWW-Authenticate`` on a 401.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Match

from controlplane.api.auth import PRINCIPAL_SCOPE_KEY, bearer_credentials, route_requirements
from controlplane.errors import (
    GoodputError,
    PayloadTooLargeError,
    UnauthenticatedError,
    UnavailableError,
)
from controlplane.settings import Settings

__all__ = ["BodyTooLargeError", "RequestLimits", "body_limit"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_INGEST_PATHS = frozenset({"/api/v1/ingest", "/v1/traces"})
_IMPORT_PATH = "/api/v1/slos:import"


class BodyTooLargeError(PayloadTooLargeError, StarletteHTTPException):
    """A body passed its route's limit while it was read (413).

    Also a Starlette ``HTTPException``: FastAPI re-raises those from its body reading
    instead of turning them into a 400, so the 413 reaches the app's error handler."""

    def __init__(self, message: str) -> None:
        PayloadTooLargeError.__init__(self, message)
        self.status_code = 413
        self.detail = message
        self.headers = None


def body_limit(path: str, settings: Settings) -> tuple[int, str]:
    """The body limit of ``path`` in bytes, and the setting that holds it."""
    if path in _INGEST_PATHS:
        return settings.max_ingest_bytes, "max_ingest_bytes"
    if path == _IMPORT_PATH:
        return settings.max_import_bytes, "max_import_bytes"
    return settings.max_request_bytes, "max_request_bytes"


def _error(exc: GoodputError, headers: dict[str, str] | None = None) -> JSONResponse:
    extra = dict(headers or {})
    if isinstance(exc, UnauthenticatedError):
        extra["WWW-Authenticate"] = "Bearer"
    return JSONResponse({"detail": exc.message}, status_code=exc.status_code, headers=extra)


def _route(scope: Scope) -> APIRoute | None:
    app = scope.get("app")
    router = getattr(app, "router", None)
    for route in getattr(router, "routes", ()):
        if isinstance(route, APIRoute):
            match, _ = route.matches(scope)
            if match is Match.FULL:
                return route
    return None


class RequestLimits:
    """The middleware (see the module); ``settings`` gives every limit."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self.settings
        header_bytes = sum(len(k) + len(v) for k, v in scope["headers"])
        if header_bytes > settings.max_header_bytes:
            message = (
                f"request headers must be at most {settings.max_header_bytes} bytes "
                f"(setting max_header_bytes), got {header_bytes}"
            )
            response = JSONResponse({"detail": message}, status_code=431)
            await response(scope, receive, send)
            return
        if scope["method"] in _BODY_METHODS:
            refused = await self._refuse_early(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
            receive = self._counting(scope, receive)
        await self._bounded(scope, receive, send)

    async def _refuse_early(self, scope: Scope) -> JSONResponse | None:
        """The 413 of a declared length over the limit, or the route's 401/403."""
        limit, setting = body_limit(scope["path"], self.settings)
        declared = Request(scope).headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return _error(
                PayloadTooLargeError(
                    f"body must be at most {limit} bytes (setting {setting}), "
                    f"got Content-Length {declared}"
                )
            )
        route = _route(scope)
        if route is None:
            return None
        request = Request(scope)
        try:
            for requirement in route_requirements(route):
                principal = await requirement(request, await bearer_credentials(request))
                scope[PRINCIPAL_SCOPE_KEY] = principal
        except GoodputError as exc:
            return _error(exc)
        return None

    def _counting(self, scope: Scope, receive: Receive) -> Receive:
        limit, setting = body_limit(scope["path"], self.settings)
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLargeError(
                        f"body must be at most {limit} bytes (setting {setting}), "
                        f"got more than {limit} bytes"
                    )
            return message

        return counted

    async def _bounded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app; answer 503 if it has not started its response in time."""
        started = asyncio.Event()

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                started.set()
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, tracked))
        waiter = asyncio.ensure_future(started.wait())
        timeout_s = self.settings.request_timeout_s
        try:
            await asyncio.wait({task, waiter}, timeout=timeout_s, return_when="FIRST_COMPLETED")
        finally:
            waiter.cancel()
        if not task.done() and not started.is_set():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            if not started.is_set():
                response = _error(
                    UnavailableError(f"the request took more than {timeout_s:g} s; retry later"),
                    {"Retry-After": "1"},
                )
                await response(scope, receive, send)
            return
        await task  # done, or streaming its response: no bound on a started stream
