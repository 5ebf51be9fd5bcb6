"""The up contract: record batches from an exporter to the control plane, versioned.

A batch travels as a msgpack *envelope* ``{"v": 1, "crc32": <int>, "body": <bin>}``. The
version comes first so that a reader rejects a message it cannot read before looking further;
the CRC-32 of the body catches corruption that msgpack alone would decode into wrong numbers.
The body is a msgpack map whose array columns are raw little-endian bytes, read back with
``np.frombuffer``; token times travel as deltas (uint32 µs, or int64 in a batch where some
gap exceeds 71.6 minutes); label columns travel as dictionaries. The JSON form carries the
same content readably, for debugging. Layout, limits and the measurements behind the choices:
``docs/wire.md``.

Each batch carries ``(exporter_id, seq)``: the exporter resends a batch under the same ``seq``
until the receiver acknowledges it (at-least-once), and the receiver drops pairs it has seen.

Encoding and decoding validate the batch once (``RecordBatch.validate()`` plus the wire's own
checks) and raise :class:`WireError`, whose message names the field and the reason; a decoder
that raises returns nothing.

Example::

    data = encode_batch(batch, exporter_id="gw-0", seq=7)
    header, same = decode_batch(data)
    assert (header.exporter_id, header.seq) == ("gw-0", 7)
    assert same.request_ids == batch.request_ids
"""

from __future__ import annotations

import json
import time
import zlib
from typing import Any

import msgpack

from exporters._wire_binary import pack_body, unpack, unpack_body
from exporters._wire_json import from_json, to_json
from exporters._wire_schema import (
    MAX_EMISSIONS,
    MAX_RECORDS,
    SUPPORTED_VERSIONS,
    WIRE_VERSION,
    BatchHeader,
    WireError,
    check_batch,
    check_version,
    require_map,
)
from exporters.records import RecordBatch

__all__ = [
    "CONTENT_TYPE_BINARY",
    "CONTENT_TYPE_JSON",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_MAX_RECORDS",
    "MAX_EMISSIONS",
    "MAX_RECORDS",
    "SUPPORTED_VERSIONS",
    "WIRE_VERSION",
    "BatchHeader",
    "WireError",
    "batch_from_json",
    "batch_to_json",
    "decode_any",
    "decode_batch",
    "encode_batch",
]

CONTENT_TYPE_BINARY = "application/vnd.goodput.batch+msgpack"
CONTENT_TYPE_JSON = "application/json"
DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024
# A parsed JSON object is already in memory; this bounds the arrays built from it.
DEFAULT_MAX_RECORDS = MAX_RECORDS
ENVELOPE_FIELDS: tuple[str, ...] = ("v", "crc32", "body")


def _header(exporter_id: str, seq: int, sent_time_ns: int | None) -> BatchHeader:
    return BatchHeader(exporter_id, seq, time.time_ns() if sent_time_ns is None else sent_time_ns)


def _check_size(data: bytes, max_bytes: int) -> None:
    """Refuse a message that is not bytes-like or is over ``max_bytes``, before parsing."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError("batch", f"expected bytes, got {type(data).__name__}")
    size = memoryview(data).nbytes
    if size > max_bytes:
        raise WireError("batch", f"{size} bytes exceed max_bytes {max_bytes}")


_ENVELOPE_HEAD = b"\x83\xa1v\x01\xa5crc32"
_BIN_HEADERS = {0xC4: 1, 0xC5: 2, 0xC6: 4}
_UINT_HEADERS = {0xCC: 1, 0xCD: 2, 0xCE: 4}


def _envelope_body(data: bytes) -> tuple[memoryview, int] | None:
    """``(body, crc32)`` of a version-1 envelope laid out as :func:`encode_batch` writes it
    (the keys in its order, the body running to the end of ``data``), the body a view of
    ``data`` rather than a copy; ``None`` for any other message (decoded by msgpack then)."""
    if not isinstance(data, bytes) or not data.startswith(_ENVELOPE_HEAD):
        return None
    pos = len(_ENVELOPE_HEAD)
    if pos >= len(data):
        return None
    kind = data[pos]
    if kind <= 0x7F:
        crc, pos = kind, pos + 1
    elif kind in _UINT_HEADERS:
        size = _UINT_HEADERS[kind]
        crc, pos = int.from_bytes(data[pos + 1 : pos + 1 + size], "big"), pos + 1 + size
    else:
        return None
    if data[pos : pos + 5] != b"\xa4body" or pos + 5 >= len(data):
        return None
    pos += 5
    size = _BIN_HEADERS.get(data[pos], 0)
    if not size:
        return None
    length = int.from_bytes(data[pos + 1 : pos + 1 + size], "big")
    pos += 1 + size
    if pos + length != len(data):  # truncated, or trailing bytes: msgpack says which
        return None
    return memoryview(data)[pos:], crc


def encode_batch(
    batch: RecordBatch, *, exporter_id: str, seq: int, sent_time_ns: int | None = None
) -> bytes:
    """The binary form of ``batch`` (``sent_time_ns`` defaults to the wall clock now).

    Raises :class:`WireError` for an invalid batch or header; encodes nothing partial.
    """
    header = _header(exporter_id, seq, sent_time_ns)
    check_batch(batch)
    body = pack_body(header, batch)
    envelope = {"v": header.version, "crc32": zlib.crc32(body), "body": body}
    packed: bytes = msgpack.packb(envelope, use_bin_type=True)
    return packed


def decode_batch(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_BATCH_BYTES
) -> tuple[BatchHeader, RecordBatch]:
    """Header and batch from the binary form; the arrays are owned and writable.

    Raises :class:`WireError` for a message over ``max_bytes``, truncated or followed by
    trailing bytes, corrupted (CRC-32 mismatch), of an unsupported version, or whose content
    breaks the contract (column lengths, dictionary codes, CSR counts, token counts, ...).
    """
    _check_size(data, max_bytes)
    framed = _envelope_body(data)
    if framed is not None:  # the exporters' own layout: the body read in place
        return _checked_body(*framed)
    envelope = unpack(data, "batch")
    if not isinstance(envelope, dict):
        raise WireError("batch", f"expected a map, got {type(envelope).__name__}")
    if "v" not in envelope:
        raise WireError("v", "missing")
    check_version(envelope["v"])
    envelope = require_map(envelope, "batch", ENVELOPE_FIELDS, top_level=True)
    body, crc = envelope["body"], envelope["crc32"]
    if not isinstance(body, bytes):
        raise WireError("body", f"expected raw bytes, got {type(body).__name__}")
    return _checked_body(body, crc)


def _checked_body(body: bytes | memoryview, crc: object) -> tuple[BatchHeader, RecordBatch]:
    """The header and batch of an envelope's ``body``, once its CRC-32 matches ``crc``."""
    actual = zlib.crc32(body)
    if crc != actual:
        raise WireError(
            "crc32", f"checksum mismatch (message says {crc!r}, body has {actual}): corrupted"
        )
    header, batch = unpack_body(body)
    check_batch(batch)
    return header, batch


def batch_to_json(
    batch: RecordBatch, *, exporter_id: str, seq: int, sent_time_ns: int | None = None
) -> dict[str, Any]:
    """The JSON form of ``batch``: a dict ready for ``json.dumps`` (same content as binary).

    Raises :class:`WireError` for an invalid batch or header.
    """
    header = _header(exporter_id, seq, sent_time_ns)
    check_batch(batch)
    return to_json(header, batch)


def batch_from_json(
    obj: Any, *, max_records: int = DEFAULT_MAX_RECORDS
) -> tuple[BatchHeader, RecordBatch]:
    """Header and batch from a parsed JSON object (see :func:`batch_to_json`).

    Raises :class:`WireError` as :func:`decode_batch` does, and for more than ``max_records``.
    """
    header, batch = from_json(obj, max_records)
    check_batch(batch)
    return header, batch


def decode_any(
    data: bytes, content_type: str, *, max_bytes: int = DEFAULT_MAX_BATCH_BYTES
) -> tuple[BatchHeader, RecordBatch]:
    """Decode a request body by its ``Content-Type`` (parameters such as ``charset`` ignored).

    Raises :class:`WireError`, also for a content type other than the two supported ones.
    """
    media = content_type.split(";", 1)[0].strip().lower()
    if media == CONTENT_TYPE_BINARY:
        return decode_batch(data, max_bytes=max_bytes)
    if media != CONTENT_TYPE_JSON:
        raise WireError(
            "content_type",
            f"unsupported {content_type!r}; supported: {[CONTENT_TYPE_BINARY, CONTENT_TYPE_JSON]}",
        )
    _check_size(data, max_bytes)
    try:
        obj = json.loads(bytes(data))  # bytes() also takes a memoryview or bytearray
    except (ValueError, RecursionError) as exc:
        raise WireError("batch", f"invalid JSON ({exc})") from None
    return batch_from_json(obj)
