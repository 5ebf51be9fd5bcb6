"""OTLP/HTTP trace bodies in and out: ``ExportTraceServiceRequest`` (protobuf or
OTLP/JSON) parsing, the ``ExportTraceServiceResponse`` answer, and ``google.rpc.Status``
error bodies. The mapping of spans to records is in :mod:`controlplane.ingest.otlp`.
"""

from __future__ import annotations

import base64
import json

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = [
    "CONTENT_TYPE_JSON",
    "CONTENT_TYPE_PROTOBUF",
    "OtlpDecodeError",
    "export_response",
    "media_type",
    "parse_export_request",
    "rpc_status",
]

CONTENT_TYPE_PROTOBUF = "application/x-protobuf"
CONTENT_TYPE_JSON = "application/json"
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


class OtlpDecodeError(ValueError):
    """A body that is not an ``ExportTraceServiceRequest`` of the declared content type."""


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def parse_export_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """The request from a protobuf or OTLP/JSON body; raises :class:`OtlpDecodeError`
    (and ``ValueError`` subclasses only) naming what is wrong."""
    media = media_type(content_type)
    message = ExportTraceServiceRequest()
    if media == CONTENT_TYPE_PROTOBUF:
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpDecodeError(
                f"body: not an ExportTraceServiceRequest protobuf ({exc})"
            ) from None
        return message
    if media != CONTENT_TYPE_JSON:
        raise OtlpDecodeError(
            f"content-type must be {CONTENT_TYPE_PROTOBUF!r} or {CONTENT_TYPE_JSON!r}, "
            f"got {content_type!r}"
        )
    try:
        document = json.loads(body)
        _hex_ids_to_base64(document)
        json_format.ParseDict(document, message, ignore_unknown_fields=True)
    except (ValueError, RecursionError, json_format.ParseError) as exc:
        raise OtlpDecodeError(f"body: not an OTLP/JSON ExportTraceServiceRequest ({exc})") from None
    return message


def _hex_ids_to_base64(document: object) -> None:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping wants base64."""
    if not isinstance(document, dict):
        raise OtlpDecodeError(f"body: expected a JSON object, got {type(document).__name__}")
    for resource_spans in document.get("resourceSpans") or []:
        for scope_spans in (resource_spans or {}).get("scopeSpans") or []:
            for span in (scope_spans or {}).get("spans") or []:
                if not isinstance(span, dict):
                    continue
                for key in _ID_FIELDS:
                    value = span.get(key)
                    if isinstance(value, str) and value:
                        try:
                            span[key] = base64.b64encode(bytes.fromhex(value)).decode()
                        except ValueError:
                            raise OtlpDecodeError(
                                f"{key}: must be a hex string, got {value[:40]!r}"
                            ) from None


def export_response(
    content_type: str, rejected_spans: int = 0, error_message: str = ""
) -> tuple[bytes, str]:
    """The ``ExportTraceServiceResponse`` body and its media type (that of the request),
    with ``partial_success`` when spans were rejected."""
    response = ExportTraceServiceResponse()
    if rejected_spans:
        response.partial_success.rejected_spans = rejected_spans
        response.partial_success.error_message = error_message
    if media_type(content_type) == CONTENT_TYPE_JSON:
        return json_format.MessageToJson(response, indent=None).encode(), CONTENT_TYPE_JSON
    return response.SerializeToString(), CONTENT_TYPE_PROTOBUF


def rpc_status(code: int, message: str, content_type: str) -> tuple[bytes, str]:
    """A ``google.rpc.Status`` body (what OTLP/HTTP answers with an error status).

    Encoded by hand (two fields) so the receiver needs no googleapis package.
    """
    if media_type(content_type) == CONTENT_TYPE_JSON:
        return json.dumps({"code": code, "message": message}).encode(), CONTENT_TYPE_JSON
    text = message.encode("utf-8")
    return (
        b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text,
        CONTENT_TYPE_PROTOBUF,
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
