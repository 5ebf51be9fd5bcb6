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
5. **Rates** (token buckets, bounded tables): a client address whose requests failed
   authentication (401) more than ``auth_failure_burst`` times, refilled at
   ``auth_failures_per_s``, gets 429 with ``Retry-After`` before any key lookup; each
   credential (bearer key or console session) may call the admin API (``/api/v1/*`` but
   ingest) ``admin_burst`` times, refilled at ``admin_requests_per_s``, then 429.

Errors have the app's shape (``{"detail": ...}``), with ``WWW-Authenticate`` on a 401.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi.routing import APIRoute
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match

from controlplane.api.auth import PRINCIPAL_SCOPE_KEY, bearer_credentials, route_requirements
from controlplane.errors import (
    GoodputError,
    PayloadTooLargeError,
    UnauthenticatedError,
    UnavailableError,
)
from controlplane.ingest.otlp_codec import rpc_status
from controlplane.settings import Settings

__all__ = ["BodyTooLargeError", "RequestLimits", "TokenBuckets", "body_limit"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_API_PREFIX = "/api/v1/"
_MAX_TRACKED = 100_000  # clients / credentials per rate table (least recently seen evicted)
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


# OTLP/HTTP answers errors as a google.rpc.Status in the request's encoding (the receiver's
# own errors do the same: controlplane.api.routes.otlp).
_OTLP_PATH = "/v1/traces"
_RPC_CODES = {401: 16, 403: 7, 413: 8, 429: 8, 503: 14}


def _error(
    exc: GoodputError, headers: dict[str, str] | None = None, scope: Scope | None = None
) -> Response:
    extra = dict(headers or {})
    if isinstance(exc, UnauthenticatedError):
        extra["WWW-Authenticate"] = "Bearer"
    if scope is not None and scope["path"] == _OTLP_PATH:
        content_type = Request(scope).headers.get("content-type", "")
        code = _RPC_CODES.get(exc.status_code, 2)
        body, media = rpc_status(code, exc.message, content_type)
        return Response(body, status_code=exc.status_code, media_type=media, headers=extra)
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


class TokenBuckets:
    """Per-key token buckets of ``burst`` tokens refilled at ``rate_per_s``, at most
    ``max_keys`` keys (least recently used evicted: an evicted key starts full)."""

    def __init__(
        self,
        rate_per_s: float,
        burst: float,
        max_keys: int = _MAX_TRACKED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate_per_s, self.burst, self.max_keys, self.clock = rate_per_s, burst, max_keys, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _level(self, key: str) -> float:
        tokens, at = self._buckets.get(key, (self.burst, self.clock()))
        return min(self.burst, tokens + (self.clock() - at) * self.rate_per_s)

    def wait_s(self, key: str) -> float:
        """Seconds until ``key`` has a token again (0 when it has one now)."""
        level = self._level(key)
        return 0.0 if level >= 1 else (1 - level) / self.rate_per_s

    def take(self, key: str) -> float:
        """Take a token; returns 0, or the seconds to wait when there is none (none taken)."""
        level = self._level(key)
        if level < 1:
            return (1 - level) / self.rate_per_s
        self._buckets[key] = (level - 1, self.clock())
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return 0.0


def _too_many(message: str, wait_s: float) -> JSONResponse:
    retry = str(max(1, math.ceil(wait_s)))
    return JSONResponse({"detail": message}, status_code=429, headers={"Retry-After": retry})


def _credential(scope: Scope) -> str | None:
    """What identifies the caller's credential without looking it up: the bearer key's
    first characters (its public prefix), else the console session cookie's."""
    headers = Request(scope).headers
    authorization = headers.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        return "k:" + authorization[7:27]
    cookie = headers.get("cookie", "")
    return "c:" + cookie[:64] if cookie else None


class RequestLimits:
    """The middleware (see the module); ``settings`` gives every limit."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.failures = TokenBuckets(settings.auth_failures_per_s, settings.auth_failure_burst)
        self.admin = TokenBuckets(settings.admin_requests_per_s, settings.admin_burst)

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
        client = (scope.get("client") or ("", 0))[0]
        refused: Response | None = self._rate_limited(scope, client)
        if refused is None and scope["method"] in _BODY_METHODS:
            refused = await self._refuse_early(scope)
            if refused is None:
                receive = self._counting(scope, receive)
        if refused is not None:
            if refused.status_code == 401:
                self.failures.take(client)
            await refused(scope, receive, send)
            return

        async def counting_failures(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                self.failures.take(client)
            await send(message)

        await self._bounded(scope, receive, counting_failures)

    def _rate_limited(self, scope: Scope, client: str) -> JSONResponse | None:
        wait_s = self.failures.wait_s(client)
        if wait_s > 0:
            return _too_many(
                "too many failed authentications from this address; retry later", wait_s
            )
        path = scope["path"]
        if path.startswith(_API_PREFIX) and path not in _INGEST_PATHS:
            credential = _credential(scope)
            if credential is not None and (wait_s := self.admin.take(credential)) > 0:
                return _too_many(
                    f"more than {self.settings.admin_requests_per_s:g} requests/s with this "
                    f"credential (burst {self.settings.admin_burst}); retry later",
                    wait_s,
                )
        return None

    async def _refuse_early(self, scope: Scope) -> Response | None:
        """The 413 of a declared length over the limit, or the route's 401/403."""
        limit, setting = body_limit(scope["path"], self.settings)
        declared = Request(scope).headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return _error(
                PayloadTooLargeError(
                    f"body must be at most {limit} bytes (setting {setting}), "
                    f"got Content-Length {declared}"
                ),
                scope=scope,
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
        except DBAPIError:  # the key lookup's database is away: as the app's handler says
            return _error(UnavailableError("the database is unavailable; retry later"))
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
