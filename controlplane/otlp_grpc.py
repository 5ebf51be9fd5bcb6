"""OTLP/gRPC trace receiver: ``TraceService/Export`` on ``otlp_grpc_port`` (OTLP's is 4317).

vLLM's ``--otlp-traces-endpoint`` speaks gRPC unless ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``
says ``http/protobuf``; this receiver takes what the OTLP/HTTP route (``POST /v1/traces``)
takes, with the same mapping, limits and answers:

* metadata ``authorization: Bearer <key>`` of role ``ingest`` (or ``admin``): else
  ``UNAUTHENTICATED`` / ``PERMISSION_DENIED``;
* a body that is not an ``ExportTraceServiceRequest``: ``INVALID_ARGUMENT`` (the request is
  read as bytes and parsed here, so a malformed message never becomes ``INTERNAL``); larger
  than ``max_ingest_bytes``: ``RESOURCE_EXHAUSTED`` (gRPC's own limit); gzip is gRPC's;
* an ``llm_request`` span that cannot be mapped is rejected alone and reported in
  ``partial_success`` (``OK``), exactly as over HTTP; another tenant's records:
  ``PERMISSION_DENIED``; the engine not loaded or failing: ``UNAVAILABLE`` (exporters retry).

``grpcio`` is optional (the ``grpc`` extra; vLLM brings it): without it, or with
``otlp_grpc_port`` unset, the control plane starts without this receiver and logs why. A
port it cannot bind (taken) is logged and skipped the same way: OTLP/HTTP still serves.
``SO_REUSEPORT`` is off, so two control planes never share a port silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from controlplane.api.auth import grants
from controlplane.db import utcnow
from controlplane.ingest import (
    IngestFailedError,
    OtlpDecodeError,
    TenantScopeError,
    map_spans,
    parse_export_request,
)
from controlplane.ingest.otlp_codec import CONTENT_TYPE_PROTOBUF
from controlplane.models import KeyRole
from controlplane.runtime.live import LiveGoodput
from controlplane.services import keys as key_service
from controlplane.settings import Settings

if TYPE_CHECKING:
    import grpc

__all__ = ["SERVICE", "otlp_grpc_lifespan"]

logger = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class _Receiver:
    """The ``Export`` handler, bound to one app's key store and live engine."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def export(self, body: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        import grpc

        tenant = await self._authenticate(context)
        live: LiveGoodput = self.app.state.live
        ingestor = live.ingestor
        if not await live.ensure_loaded():
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"the goodput engine has not loaded the SLO set yet ({live.load_error})",
            )
        try:
            request = parse_export_request(body, CONTENT_TYPE_PROTOBUF)
        except OtlpDecodeError as exc:
            ingestor.count_rejected("otlp", len(body))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        mapping = await asyncio.to_thread(map_spans, request)
        ingestor.count_spans(
            mapped=len(mapping.batch), ignored=mapping.num_ignored, rejected=mapping.num_rejected
        )
        if len(mapping.batch):
            try:
                outcome = await asyncio.to_thread(
                    ingestor.apply_unsequenced, mapping.batch, tenant=tenant, num_bytes=len(body)
                )
            except TenantScopeError as exc:
                ingestor.count_rejected("otlp", len(body))
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            except IngestFailedError as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            mapping = mapping.rejecting(
                [f"request {r.request_id!r}: {r.field} {r.reason}" for r in outcome.rejections]
            )
        response = ExportTraceServiceResponse()
        if mapping.num_rejected:
            response.partial_success.rejected_spans = mapping.num_rejected
            response.partial_success.error_message = mapping.error_message
        return response.SerializeToString()

    async def _authenticate(self, context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
        """The tenant of the caller's ingest key; aborts the call otherwise."""
        import grpc

        app = self.app
        settings: Settings = app.state.settings
        metadata = dict(context.invocation_metadata() or ())
        header = metadata.get("authorization", "")
        scheme, _, presented = str(header).partition(" ")
        if scheme.lower() != "bearer" or not presented:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "metadata 'authorization: Bearer <API key>' is required",
            )
        key = await key_service.authenticate_cached(
            app.state.sessions,
            key_service.key_cache(app.state.engine, ttl_s=settings.key_cache_ttl_s),
            presented.strip(),
            now=utcnow(),
            touch_after_s=settings.key_last_used_resolution_s,
        )
        if key is None:
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "invalid API key: unknown or revoked"
            )
        assert key is not None
        if not grants(key.role, KeyRole.INGEST):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"TraceService/Export needs role 'ingest' (allowed: admin, ingest); key "
                f"{key.name!r} has role {key.role.value!r}",
            )
        return key.tenant


@asynccontextmanager
async def otlp_grpc_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Serve ``TraceService/Export`` while the app runs (after ``live_lifespan``).

    ``app.state.otlp_grpc_port`` is the bound port (useful with port 0), or ``None`` when
    the receiver is off, with the reason in ``app.state.otlp_grpc_off``."""
    settings: Settings = app.state.settings
    app.state.otlp_grpc_port = None
    app.state.otlp_grpc_off = ""
    if settings.otlp_grpc_port is None:
        app.state.otlp_grpc_off = "GOODPUT_OTLP_GRPC_PORT is unset"
        yield
        return
    try:
        import grpc
    except ImportError:
        app.state.otlp_grpc_off = "grpcio is not installed (pip install 'goodput[grpc]')"
        logger.warning(
            "OTLP/gRPC receiver off: %s; OTLP/HTTP POST /v1/traces still serves",
            app.state.otlp_grpc_off,
        )
        yield
        return
    receiver = _Receiver(app)
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Export": grpc.unary_unary_rpc_method_handler(
                receiver.export, request_deserializer=None, response_serializer=None
            )
        },
    )
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", settings.max_ingest_bytes),
        ]
    )
    server.add_generic_rpc_handlers((handler,))
    host = settings.otlp_grpc_host or settings.host
    address = f"{host}:{settings.otlp_grpc_port}"
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        app.state.otlp_grpc_off = f"cannot bind {address} ({exc})"
        logger.error(
            "OTLP/gRPC receiver off: %s; OTLP/HTTP POST /v1/traces still serves",
            app.state.otlp_grpc_off,
        )
        yield
        return
    await server.start()
    app.state.otlp_grpc_port = port
    logger.info("OTLP/gRPC receiver on %s:%d", host, port)
    try:
        yield
    finally:
        await server.stop(grace=2.0)
