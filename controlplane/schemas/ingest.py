"""Wire models of ``POST /api/v1/ingest``: its answer (:class:`IngestResultPublic`) and the
JSON Schema of a record batch's JSON form (``docs/wire.md``), for the OpenAPI document.

The server does not validate with it: ``exporters.wire`` decodes and checks the batch once.
The schema states every rule of a single field that the codec enforces (types, enum names,
integer ranges, required and unknown fields), and nothing more, so a body it refuses is one
the codec refuses too. What JSON Schema cannot say is left to the codec (a 422 naming the
field): every per-record column holds one entry per ``request_ids`` entry, emission times
rise within a request, ``emission_tokens`` rows match ``emission_offsets_us`` rows.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from exporters.records import LABEL_KEYS, Phase, Status, TokenDetail, Vantage
from exporters.wire import DEFAULT_MAX_RECORDS, WIRE_VERSION

__all__ = ["WIRE_BATCH_JSON_SCHEMA", "IngestResultPublic", "RecordRejectionPublic"]


class RecordRejectionPublic(BaseModel):
    """A record of the batch that was not taken: its row (0-based, as sent), id and why."""

    index: int
    request_id: str
    field: str
    msg: str


class IngestResultPublic(BaseModel):
    """What the batch did; counts are of what was applied (all 0 for a duplicate).
    ``rejected`` lists exactly the records not taken (``num_rejected`` of them)."""

    duplicate: bool
    exporter_id: str
    seq: int
    num_records: int
    num_final: int
    num_emissions: int
    num_tokens: int
    num_rejected: int = 0
    rejected: list[RecordRejectionPublic] = []


_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1
_MAX_EXPORTER_ID_CHARS = 256  # exporters' BatchHeader bound (docs/wire.md)


def _int(low: int, high: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": high}


def _column(items: dict[str, Any]) -> dict[str, Any]:
    """One value per record."""
    return {"type": "array", "items": items}


def _names(enum: type[Vantage | Status | TokenDetail]) -> dict[str, Any]:
    return {"type": "string", "enum": [member.name.lower() for member in enum]}


def _object(properties: dict[str, Any], description: str = "") -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }
    if description:
        schema["description"] = description
    return schema


_STRINGS = _column({"type": "string"})

WIRE_BATCH_JSON_SCHEMA: dict[str, Any] = _object(
    {
        "v": {"type": "integer", "enum": [WIRE_VERSION], "description": "the wire version"},
        "exporter_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": _MAX_EXPORTER_ID_CHARS,
            "description": "stable for the exporter's lifetime; with seq, the batch's identity",
        },
        "seq": _int(0, _INT64_MAX) | {"description": "the exporter's batch counter"},
        "sent_time_ns": _int(0, _INT64_MAX),
        "request_ids": {
            "type": "array",
            "items": {"type": "string"},
            "maxItems": DEFAULT_MAX_RECORDS,
        },
        "vantage": _column(_names(Vantage)),
        "status": _column(_names(Status)),
        "token_detail": _column(_names(TokenDetail)),
        "arrival_time_ns": _column(_int(-_INT64_MAX - 1, _INT64_MAX)),
        "kv_bytes": _column(_int(0, _INT64_MAX)),
        "prompt_tokens": _column(_int(0, _INT32_MAX)),
        "cached_tokens": _column(_int(0, _INT32_MAX)),
        "final": _column({"type": "boolean"}),
        "labels": _object({key: _STRINGS for key in LABEL_KEYS}, "one string per record"),
        "reason": _STRINGS,
        "phase_offsets_us": _object(
            {phase.name.lower(): _column(_int(-1, _INT64_MAX)) for phase in Phase},
            "µs after arrival, -1 when absent",
        ),
        "emission_offsets_us": _column(
            {"type": "array", "items": _int(0, _INT64_MAX), "description": "µs after arrival"}
        ),
        "emission_tokens": {
            "anyOf": [_column({"type": "array", "items": _int(1, _INT32_MAX)}), {"type": "null"}],
            "description": "tokens per emission; null when every emission carries one",
        },
    },
    "A record batch in the wire contract's JSON form (docs/wire.md): one entry per record in "
    "every column, in the order of request_ids.",
)
