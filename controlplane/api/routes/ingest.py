"""``POST /api/v1/ingest``: record batches from exporters into the live goodput engine.

Role ``ingest`` (``admin`` too). The body is a batch of the wire contract
(``exporters.wire``): binary (``application/vnd.goodput.batch+msgpack``) or its JSON debug
form (``application/json``), optionally ``Content-Encoding: gzip``; at most
``max_ingest_bytes`` bytes, refused with 413 before it is read whole.

Answers: 200 ``IngestResultPublic`` (``duplicate: true`` and zero counts for a batch whose
``(exporter_id, seq)`` was applied before: nothing is applied twice); 400 for a body that
does not decode (truncated, corrupted, not msgpack/JSON); 422 for a batch that decodes but
breaks the contract (the entry names the field, e.g. ``emission_offsets_us``); 403 for a
tenant-scoped key sending another tenant's records; 409 for a ``seq`` below the
de-duplication window (an exporter restarted under the same id); 413; 415; 503 when the
engine failed or has not loaded the SLO set yet (nothing applied; the exporter retries). A
batch that breaks the contract is refused whole; in a batch that decodes, a record the
engine could not count (out of its time range, too many tokens, phases out of order, a
repeated id: ``controlplane.ingest.screen``) is left out alone and listed in ``rejected``
with a 200, the others applied. The decoding and the engine's work run in a worker
thread.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from controlplane.api.deps import Ingest, LiveDep, SettingsDep
from controlplane.errors import (
    ConflictError,
    ForbiddenError,
    InvalidInputError,
    PayloadTooLargeError,
    UnavailableError,
    UnsupportedMediaTypeError,
)
from controlplane.ingest import (
    IngestFailedError,
    Ingestor,
    IngestOutcome,
    MalformedBodyError,
    StaleBatchError,
    TenantScopeError,
    read_limited,
)
from controlplane.schemas.common import ErrorPublic, responses
from controlplane.schemas.ingest import (
    WIRE_BATCH_JSON_SCHEMA,
    IngestResultPublic,
    RecordRejectionPublic,
)
from exporters.wire import CONTENT_TYPE_BINARY, CONTENT_TYPE_JSON, WireError, decode_any

__all__ = ["router"]

router = APIRouter(tags=["ingest"])

# Message-level failures: the body is not a batch at all (400). Any other field: 422.
_MESSAGE_FIELDS = frozenset({"batch", "body", "crc32"})
_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": (
            "A record batch of the wire contract (docs/wire.md): binary (what exporters send) "
            "or its JSON form, optionally `Content-Encoding: gzip`"
        ),
        "content": {
            CONTENT_TYPE_BINARY: {"schema": {"type": "string", "format": "binary"}},
            CONTENT_TYPE_JSON: {"schema": WIRE_BATCH_JSON_SCHEMA},
        },
    }
}
BAD_REQUEST: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorPublic, "description": "The body does not decode as a batch"}
}


def _decode_and_apply(
    ingestor: Ingestor, body: bytes, content_type: str, tenant: str | None, max_bytes: int
) -> IngestOutcome:
    """Runs in a worker thread: the codec's and the engine's work are per batch."""
    try:
        header, batch = decode_any(body, content_type, max_bytes=max_bytes)
    except WireError:
        raise
    except Exception as exc:  # a codec failure on hostile input must not be a 500
        raise WireError("batch", f"undecodable ({type(exc).__name__}: {exc})") from None
    return ingestor.apply(
        header, batch, tenant=tenant, num_bytes=len(body), body=(body, content_type)
    )


def _wire_error(exc: WireError) -> Exception:
    if exc.field == "content_type":
        return UnsupportedMediaTypeError(f"content-type: {exc.reason}")
    if exc.field in _MESSAGE_FIELDS:
        return MalformedBodyError(str(exc))
    return InvalidInputError(str(exc), loc=("body", *exc.field.split(".")))


@router.post(
    "/ingest",
    responses={**BAD_REQUEST, **responses(409, 413, 415)},
    openapi_extra=_BODY_DOC,
)
async def ingest(
    principal: Ingest, live: LiveDep, settings: SettingsDep, request: Request
) -> IngestResultPublic:
    """Apply one record batch, once per ``(exporter_id, seq)``."""
    max_bytes = settings.max_ingest_bytes
    ingestor: Ingestor = live.ingestor
    headers = request.headers
    try:
        body = await read_limited(
            request.stream(),
            content_length=headers.get("content-length"),
            content_encoding=headers.get("content-encoding"),
            max_bytes=max_bytes,
        )
    except (PayloadTooLargeError, UnsupportedMediaTypeError, MalformedBodyError):
        ingestor.count_rejected("wire")
        raise
    try:
        outcome = await run_in_threadpool(
            _decode_and_apply,
            ingestor,
            body,
            headers.get("content-type", ""),
            principal.tenant,
            max_bytes,
        )
    except WireError as exc:
        ingestor.count_rejected("wire", len(body))
        raise _wire_error(exc) from None
    except TenantScopeError as exc:
        ingestor.count_rejected("wire", len(body))
        raise ForbiddenError(str(exc)) from None
    except StaleBatchError as exc:
        raise ConflictError(str(exc)) from None
    except IngestFailedError as exc:
        raise UnavailableError(str(exc)) from None
    return IngestResultPublic(
        duplicate=outcome.duplicate,
        exporter_id=outcome.exporter_id,
        seq=outcome.seq,
        num_records=outcome.num_records,
        num_final=outcome.num_final,
        num_emissions=outcome.num_emissions,
        num_tokens=outcome.num_tokens,
        num_rejected=len(outcome.rejections),
        rejected=[
            RecordRejectionPublic(
                index=r.index, request_id=r.request_id, field=r.field, msg=f"{r.field} {r.reason}"
            )
            for r in outcome.rejections
        ],
    )
