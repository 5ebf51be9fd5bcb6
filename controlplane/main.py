"""The control plane's FastAPI application: ``create_app(settings) -> FastAPI``.

The lifespan opens the database (``app.state.engine``, ``app.state.sessions``), then enters
the extra lifespans it was given, in order (the goodput engine, control loops, ...), and
closes them in reverse. Every API route must declare a role (``controlplane.api.auth``):
the app refuses to start otherwise.

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

import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter, Depends, FastAPI

from controlplane.api.auth import assert_routes_guarded, document_open_routes
from controlplane.api.deps import single_valued_query
from controlplane.api.routes import (
    audit,
    fleet,
    goodput,
    health,
    ingest,
    keys,
    metrics,
    otlp,
    slos,
)
from controlplane.db import create_engine_for, session_factory
from controlplane.errors import install_error_handlers
from controlplane.live import app_registry, live_lifespan
from controlplane.schemas.common import ERROR_RESPONSES
from controlplane.settings import Settings

__all__ = ["API_PREFIX", "Lifespan", "configure_logging", "create_app"]

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
                for extra in (live_lifespan, *lifespans):
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
        docs_url="/docs",
        dependencies=[Depends(single_valued_query)],
    )
    app.state.settings = settings
    app.state.metrics_registry = app_registry()
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(otlp.router)
    api = APIRouter(prefix=API_PREFIX, responses=ERROR_RESPONSES)
    api.include_router(slos.router)
    api.include_router(keys.router)
    api.include_router(audit.router)
    api.include_router(fleet.router)
    api.include_router(ingest.router)
    api.include_router(goodput.router)
    app.include_router(api)
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
