"""``POST /v1/traces``: an OTLP/HTTP trace receiver feeding the live goodput engine.

Point vLLM's ``--otlp-traces-endpoint`` (or any OTLP/HTTP exporter, or a collector's
``otlphttp`` exporter) at ``http://<control plane>/v1/traces`` with the header
``Authorization: Bearer <ingest key>``. Role ``ingest`` (``admin`` too).

Bodies: ``application/x-protobuf`` or OTLP/JSON ``application/json``, optionally
``Content-Encoding: gzip``, at most ``max_ingest_bytes``. ``llm_request`` spans become
request records (``controlplane.ingest.otlp``); other spans are ignored. The answer is an
``ExportTraceServiceResponse`` in the request's encoding, with ``partial_success`` giving
the number of rejected spans and why. Errors carry a ``google.rpc.Status`` body as OTLP/HTTP
specifies: 400 (undecodable), 413, 415, 403 (another tenant's records), 503 (the engine
failed or has not loaded the SLO set yet; OTLP exporters retry on 503).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.concurrency import run_in_threadpool

from controlplane.api.deps import Ingest, LiveRuntimeDep, SettingsDep
from controlplane.errors import PayloadTooLargeError, UnsupportedMediaTypeError
from controlplane.ingest import (
    IngestFailedError,
    MalformedBodyError,
    OtlpDecodeError,
    SpanMapping,
    TenantScopeError,
    export_response,
    map_spans,
    parse_export_request,
    read_limited,
    rpc_status,
)
from controlplane.ingest.otlp_codec import CONTENT_TYPE_JSON, CONTENT_TYPE_PROTOBUF, media_type
from controlplane.schemas.common import responses

__all__ = ["router"]

router = APIRouter(tags=["otlp"])

_MEDIA_TYPES = (CONTENT_TYPE_PROTOBUF, CONTENT_TYPE_JSON)
# google.rpc.Code values for the statuses we answer.
_RPC_CODES = {400: 3, 403: 7, 413: 8, 415: 3, 503: 14}
_BINARY = {"schema": {"type": "string", "format": "binary"}}
_OTLP_BODY = {
    "requestBody": {
        "required": True,
        "description": (
            "An OTLP `ExportTraceServiceRequest`: protobuf, or OTLP/JSON with hex trace and "
            "span ids (https://opentelemetry.io/docs/specs/otlp/#otlphttp); unknown JSON "
            "fields are ignored. Optionally `Content-Encoding: gzip`."
        ),
        "content": {
            CONTENT_TYPE_PROTOBUF: _BINARY,
            CONTENT_TYPE_JSON: {"schema": {"type": "object"}},
        },
    }
}
_RPC_STATUS: dict[str, Any] = {
    "title": "google.rpc.Status",
    "type": "object",
    "required": ["code", "message"],
    "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
}
_EXPORT_RESPONSE: dict[str, Any] = {
    "title": "ExportTraceServiceResponse",
    "type": "object",
    "properties": {
        "partialSuccess": {
            "type": "object",
            "properties": {
                # An int64: a decimal string in OTLP/JSON (proto3 JSON mapping).
                "rejectedSpans": {"type": ["string", "integer"]},
                "errorMessage": {"type": "string"},
            },
        }
    },
}
_ERROR = {"$ref": "#/components/schemas/ErrorPublic"}


def _documented(description: str, json_schema: dict[str, Any]) -> dict[str, Any]:
    """A response in either OTLP encoding: the schema of its JSON form, or protobuf."""
    content = {CONTENT_TYPE_JSON: {"schema": json_schema}, CONTENT_TYPE_PROTOBUF: _BINARY}
    return {"description": description, "content": content}


# OTLP/HTTP errors are a google.rpc.Status in the request's encoding; the key check and the
# app-wide query rule answer as every other route ({"detail": ...}).
_RESPONSES: dict[int | str, dict[str, Any]] = {
    **responses(401, 422, 429),
    200: _documented("An ExportTraceServiceResponse in the request's encoding", _EXPORT_RESPONSE),
    400: _documented("The body does not decode", _RPC_STATUS),
    403: _documented(
        "The key's role may not call this route, or it sent another tenant's records",
        {"anyOf": [_ERROR, _RPC_STATUS]},
    ),
    413: _documented("Request body too large", _RPC_STATUS),
    415: _documented("Unsupported content type or encoding", _RPC_STATUS),
    503: _documented(
        "The database is unavailable, or the engine failed or has not loaded the SLO set "
        "(OTLP exporters retry)",
        {"anyOf": [_ERROR, _RPC_STATUS]},
    ),
}


def _status_response(
    status: int, message: str, content_type: str, headers: dict[str, str] | None = None
) -> Response:
    body, media = rpc_status(_RPC_CODES.get(status, 2), message, content_type)
    return Response(body, status_code=status, media_type=media, headers=headers)


def _parse(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    try:
        return parse_export_request(body, content_type)
    except OtlpDecodeError:
        raise
    except Exception as exc:  # the codec's failure on hostile JSON must be a 400, not a 500
        raise OtlpDecodeError(
            f"body: not an OTLP/JSON ExportTraceServiceRequest ({type(exc).__name__}: {exc})"
        ) from None


def _map(body: bytes, content_type: str) -> SpanMapping:
    """Runs in a worker thread: parsing and mapping are per span."""
    return map_spans(_parse(body, content_type))


@router.post("/v1/traces", response_class=Response, responses=_RESPONSES, openapi_extra=_OTLP_BODY)
async def export_traces(
    principal: Ingest, live: LiveRuntimeDep, settings: SettingsDep, request: Request
) -> Response:
    """Receive OTLP spans; ``llm_request`` spans become request records."""
    ingestor = live.ingestor
    content_type = request.headers.get("content-type", "")
    if not await live.ensure_loaded():
        message = f"the goodput engine has not loaded the SLO set yet ({live.load_error})"
        media = content_type if media_type(content_type) in _MEDIA_TYPES else CONTENT_TYPE_JSON
        return _status_response(503, message, media, headers={"Retry-After": "1"})
    if media_type(content_type) not in _MEDIA_TYPES:
        ingestor.count_rejected("otlp")
        message = f"content-type must be one of {list(_MEDIA_TYPES)}, got {content_type!r}"
        return _status_response(415, message, CONTENT_TYPE_JSON)
    try:
        body = await read_limited(
            request.stream(),
            content_length=request.headers.get("content-length"),
            content_encoding=request.headers.get("content-encoding"),
            max_bytes=settings.max_ingest_bytes,
        )
    except (PayloadTooLargeError, UnsupportedMediaTypeError, MalformedBodyError) as exc:
        ingestor.count_rejected("otlp")
        return _status_response(exc.status_code, exc.message, content_type)
    try:
        mapping = await run_in_threadpool(_map, body, content_type)
    except OtlpDecodeError as exc:
        ingestor.count_rejected("otlp", len(body))
        return _status_response(400, str(exc), content_type)
    ingestor.count_spans(
        mapped=len(mapping.batch), ignored=mapping.num_ignored, rejected=mapping.num_rejected
    )
    if len(mapping.batch):
        try:
            outcome = await run_in_threadpool(
                ingestor.apply_unsequenced,
                mapping.batch,
                tenant=principal.tenant,
                num_bytes=len(body),
            )
        except TenantScopeError as exc:
            ingestor.count_rejected("otlp", len(body))
            return _status_response(403, str(exc), content_type)
        except IngestFailedError as exc:
            return _status_response(503, str(exc), content_type)
        mapping = mapping.rejecting(
            [f"request {r.request_id!r}: {r.field} {r.reason}" for r in outcome.rejections]
        )
    payload, media = export_response(content_type, mapping.num_rejected, mapping.error_message)
    return Response(payload, media_type=media)
