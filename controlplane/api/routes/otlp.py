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
failed; OTLP exporters retry on 503).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from controlplane.api.deps import Ingest
from controlplane.errors import PayloadTooLargeError, UnsupportedMediaTypeError
from controlplane.ingest import (
    IngestFailedError,
    Ingestor,
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

__all__ = ["router"]

router = APIRouter(tags=["otlp"])

_MEDIA_TYPES = (CONTENT_TYPE_PROTOBUF, CONTENT_TYPE_JSON)
# google.rpc.Code values for the statuses we answer.
_RPC_CODES = {400: 3, 403: 7, 413: 8, 415: 3, 503: 14}
_OTLP_BODY = {
    "requestBody": {
        "required": True,
        "description": "An OTLP ExportTraceServiceRequest",
        "content": {
            CONTENT_TYPE_PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
            CONTENT_TYPE_JSON: {"schema": {"type": "object"}},
        },
    }
}


def _status_response(status: int, message: str, content_type: str) -> Response:
    body, media = rpc_status(_RPC_CODES.get(status, 2), message, content_type)
    return Response(body, status_code=status, media_type=media)


def _map(body: bytes, content_type: str) -> SpanMapping:
    """Runs in a worker thread: parsing and mapping are per span."""
    return map_spans(parse_export_request(body, content_type))


@router.post("/v1/traces", response_class=Response, openapi_extra=_OTLP_BODY)
async def export_traces(principal: Ingest, request: Request) -> Response:
    """Receive OTLP spans; ``llm_request`` spans become request records."""
    ingestor: Ingestor = request.app.state.live.ingestor
    content_type = request.headers.get("content-type", "")
    if media_type(content_type) not in _MEDIA_TYPES:
        ingestor.count_rejected("otlp")
        message = f"content-type must be one of {list(_MEDIA_TYPES)}, got {content_type!r}"
        return _status_response(415, message, CONTENT_TYPE_JSON)
    try:
        body = await read_limited(
            request.stream(),
            content_length=request.headers.get("content-length"),
            content_encoding=request.headers.get("content-encoding"),
            max_bytes=request.app.state.settings.max_ingest_bytes,
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
            await run_in_threadpool(
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
    payload, media = export_response(content_type, mapping.num_rejected, mapping.error_message)
    return Response(payload, media_type=media)
