"""The control plane's FastAPI application: ``create_app(settings) -> FastAPI``.

The lifespan opens the database (``app.state.engine``, ``app.state.sessions``; nothing
connects yet), starts the live goodput runtime (``app.state.live``, :func:`live_lifespan`),
the PD planner tick (``app.state.planner``, ``controlplane.runtime.planner``; when
``settings.planner_enabled``) and the admission policy loop (``app.state.admission``,
``controlplane.runtime.admission``; when ``settings.admission_enabled``), then enters
the extra lifespans it was given, in order (control loops, ...), and closes them in
reverse. The app starts and answers ``/health`` with the database down or not migrated
(``/ready`` says why it is not ready). Every API route must declare a role
(``controlplane.api.auth``): the app refuses to start otherwise.

Example::

    app = create_app(Settings(database_url="sqlite:///./var/goodput.db"))
    # uvicorn.run(app, host="127.0.0.1", port=8000)

    @asynccontextmanager
    async def engine_lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.goodput = start_engine(app.state.sessions)
        yield
        await app.state.goodput.stop()

    app = create_app(settings, lifespans=[engine_lifespan])
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from starlette.middleware.gzip import GZipMiddleware

from controlplane.api.auth import assert_routes_guarded, document_open_routes
from controlplane.api.deps import strict_query
from controlplane.api.limits import RequestLimits
from controlplane.api.routes import (
    audit,
    automation,
    commands,
    dashboards,
    fleet,
    goodput,
    goodput_series,
    goodput_summary,
    health,
    ingest,
    keys,
    metrics,
    otlp,
    sessions,
    slos,
)
from controlplane.api.security_headers import SecurityHeaders
from controlplane.console import mount_console
from controlplane.db import create_engine_for, session_factory
from controlplane.errors import install_error_handlers
from controlplane.otlp_grpc import otlp_grpc_lifespan
from controlplane.runtime.admission import admission_lifespan
from controlplane.runtime.leadership import leadership_lifespan
from controlplane.runtime.live import LiveGoodput, app_registry
from controlplane.runtime.planner import planner_lifespan
from controlplane.schemas.common import ERROR_RESPONSES, responses
from controlplane.settings import Settings

__all__ = [
    "API_PREFIX",
    "Lifespan",
    "chain_exit_signals",
    "configure_logging",
    "create_app",
    "live_lifespan",
]

API_PREFIX = "/api/v1"
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def _version() -> str:
    try:
        return version("goodput")
    except PackageNotFoundError:
        return "0.0.0"


def create_app(settings: Settings | None = None, *, lifespans: Sequence[Lifespan] = ()) -> FastAPI:
    """Build the app; nothing touches the database until the lifespan starts."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        assert_routes_guarded(app)
        engine = create_engine_for(settings.database_url, echo=settings.database_echo)
        app.state.engine = engine
        app.state.sessions = session_factory(engine)
        try:
            async with AsyncExitStack() as stack:
                # The live goodput engine first: later lifespans may use app.state.live.
                for extra in (
                    live_lifespan,
                    otlp_grpc_lifespan,
                    leadership_lifespan,
                    planner_lifespan,
                    admission_lifespan,
                    *lifespans,
                ):
                    await stack.enter_async_context(extra(app))
                yield
        finally:
            await engine.dispose()

    app = FastAPI(
        title="Goodput control plane",
        version=_version(),
        description=(
            "SLO registry, fleet and admin API for LLM inference with prefill/decode "
            "disaggregation. Authenticate with `Authorization: Bearer <API key>`."
        ),
        lifespan=lifespan,
        docs_url=None,  # served by mount_console with local Swagger UI assets
        dependencies=[Depends(strict_query)],
    )
    app.state.settings = settings
    app.state.metrics_registry = app_registry()
    install_error_handlers(app)
    app.add_middleware(RequestLimits, settings=settings)
    # JSON, pages and static files gzip-compressed; event streams are never buffered: the
    # middleware leaves text/event-stream alone (Starlette's default exclusions).
    app.add_middleware(GZipMiddleware, minimum_size=1024, compresslevel=6)
    app.add_middleware(SecurityHeaders)  # outermost: also on the limits' own answers
    # Outside /api/v1, with the errors any route may answer (its query, the key's database).
    app.include_router(health.router, responses=responses(422, 429, 503))
    app.include_router(metrics.router, responses=responses(422, 429, 503))
    app.include_router(otlp.router)
    api = APIRouter(prefix=API_PREFIX, responses=ERROR_RESPONSES)
    api.include_router(slos.router)
    api.include_router(keys.router)
    api.include_router(audit.router)
    api.include_router(fleet.router)
    api.include_router(commands.router)
    api.include_router(automation.router)
    api.include_router(ingest.router)
    api.include_router(sessions.router)
    api.include_router(goodput_summary.router)
    api.include_router(goodput_series.router)
    api.include_router(goodput.router)
    api.include_router(dashboards.router)
    app.include_router(api)
    mount_console(app)
    _document_open_routes(app)
    return app


def _document_open_routes(app: FastAPI) -> None:
    """Publish open routes (``/health`` by default) without a security requirement."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_open_routes(app, generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


@asynccontextmanager
async def live_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the live goodput runtime on ``app.state.live`` (registry
    ``app.state.metrics_registry``); it starts even without a database
    (``controlplane.runtime.live``).

    ASGI servers such as uvicorn drain open connections *before* the lifespan shutdown, so
    an open SSE stream would hold a graceful shutdown up for good: a handler chained in
    front of the server's SIGINT/SIGTERM handlers sets ``live.stopping`` as soon as shutdown
    begins, which ends the streams."""
    registry = getattr(app.state, "metrics_registry", None)
    if registry is None:
        registry = app.state.metrics_registry = app_registry()
    live = LiveGoodput(app.state.sessions, app.state.settings, registry=registry)
    await live.start()
    app.state.live = live
    loop = asyncio.get_running_loop()
    restore = chain_exit_signals(lambda: loop.call_soon_threadsafe(live.stopping.set))
    try:
        yield
    finally:
        restore()
        await live.stop()


def chain_exit_signals(callback: Callable[[], object]) -> Callable[[], None]:
    """Run ``callback`` before the current SIGINT/SIGTERM handlers (the server's graceful
    shutdown), and return a function that puts those handlers back. Does nothing outside
    the main thread (signals are delivered there only) or for a signal without a Python
    handler (its default already ends the process)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    installed: dict[int, tuple[object, object]] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: object, previous: Callable[..., object] = previous) -> None:
            callback()
            previous(signum, frame)

        signal.signal(sig, handler)
        installed[sig] = (handler, previous)

    def restore() -> None:
        for sig, (handler, previous) in installed.items():
            if signal.getsignal(sig) is handler:  # unless someone replaced it since
                signal.signal(sig, previous)  # type: ignore[arg-type]

    return restore


class _JSONFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any ``extra=`` fields."""

    _STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in self._STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(settings: Settings) -> None:
    """Root logging for a served process (the CLI calls it; tests and embedders don't)."""
    handler = logging.StreamHandler()
    if settings.log_json:
        handler.setFormatter(_JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level_number)
