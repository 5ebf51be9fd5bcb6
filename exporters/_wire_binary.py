"""The binary body of a version-1 batch: a msgpack map whose array columns are raw
little-endian bytes. Layout and rationale: ``docs/wire.md``.

Encoding and decoding are vectorised: numpy passes over the emissions, C-level msgpack work
per record (request ids, a native msgpack array of strings), no Python bytecode per record or
token. Private: the public entry points are in :mod:`exporters.wire`.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from exporters._wire_schema import (
    MAX_EMISSIONS,
    MAX_RECORDS,
    RECORD_COLUMNS,
    BatchHeader,
    WireError,
    require_map,
    shown,
)
from exporters.records import LABEL_KEYS, NUM_PHASES, LabelColumn, RecordBatch

I64 = npt.NDArray[np.int64]
U32_MAX = 2**32 - 1

# Wire dtype of each per-record column (``final`` travels as 0/1 bytes).
WIRE_DTYPES: dict[str, str] = {
    "vantage": "<u1",
    "status": "<u1",
    "token_detail": "<u1",
    "final": "<u1",
    "arrival_time_ns": "<i8",
    "kv_bytes": "<i8",
    "prompt_tokens": "<i4",
    "cached_tokens": "<i4",
}
# Token-time deltas travel as uint32 µs when every delta fits (71.6 minutes), else int64.
DELTA_TYPES: dict[str, str] = {"u32": "<u4", "i64": "<i8"}
BODY_FIELDS: tuple[str, ...] = (
    "exporter_id",
    "seq",
    "sent_time_ns",
    "num_records",
    "num_emissions",
    "request_ids",
    *WIRE_DTYPES,
    "phase_offsets_us",
    "labels",
    "reason",
    "emission_counts",
    "emission_deltas_type",
    "emission_deltas_us",
    "emission_tokens",
)
LABEL_FIELDS: tuple[str, ...] = ("values", "codes")


def unpack(data: bytes | memoryview, field: str) -> Any:
    """``msgpack.unpackb`` with every failure turned into a :class:`WireError` on ``field``."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except msgpack.ExtraData as exc:
        raise WireError(
            field, f"unexpected trailing data after the message ({len(exc.extra)} bytes)"
        ) from None
    except msgpack.FormatError:
        raise WireError(field, "not a msgpack message (reserved format byte)") from None
    except msgpack.StackError:
        raise WireError(field, "not a batch (nested too deeply)") from None
    except (ValueError, TypeError) as exc:
        # msgpack caps container and bin lengths at the input size: a larger declared length
        # is a message that ends before its content does.
        if "incomplete input" in str(exc) or "exceeds max_" in str(exc):
            raise WireError(field, "truncated (the message ends early)") from None
        raise WireError(field, f"not a valid msgpack message ({exc})") from None


def _raw(array: npt.NDArray[Any], wire_dtype: str) -> bytes:
    return np.ascontiguousarray(array, dtype=wire_dtype).tobytes()


def _deltas(batch: RecordBatch, counts: I64) -> tuple[str, bytes]:
    """Token times as deltas: a request's first delta is its first emission's offset after
    arrival (≈ TTFT), each next one the gap to the previous emission (an ITL)."""
    offsets = batch.emission_offsets_us
    if offsets.shape[0] == 0:
        return "u32", b""
    deltas = np.empty(offsets.shape[0], dtype=np.int64)
    deltas[0] = offsets[0]
    np.subtract(offsets[1:], offsets[:-1], out=deltas[1:])
    firsts = batch.emission_starts[:-1][counts > 0]
    deltas[firsts] = offsets[firsts]
    kind = "u32" if int(deltas.max()) <= U32_MAX else "i64"
    return kind, _raw(deltas, DELTA_TYPES[kind])


def pack_body(header: BatchHeader, batch: RecordBatch) -> bytes:
    """The msgpack body of a batch that :func:`check_batch` accepted."""
    counts = np.diff(batch.emission_starts)
    if len(batch) and int(counts.max()) > U32_MAX:
        raise WireError("emission_starts", f"a request has more than {U32_MAX} emissions")
    deltas_type, deltas = _deltas(batch, counts)
    tokens = batch.emission_tokens
    body: dict[str, Any] = {
        "exporter_id": header.exporter_id,
        "seq": header.seq,
        "sent_time_ns": header.sent_time_ns,
        "num_records": len(batch),
        "num_emissions": batch.num_emissions,
        "request_ids": batch.request_ids,
        **{name: _raw(getattr(batch, name), wire) for name, wire in WIRE_DTYPES.items()},
        "phase_offsets_us": _raw(batch.phase_offsets_us, "<i8"),
        "labels": {
            key: {"values": batch.labels[key].values, "codes": _raw(batch.labels[key].codes, "<u4")}
            for key in LABEL_KEYS
        },
        "reason": {"values": batch.reason.values, "codes": _raw(batch.reason.codes, "<u4")},
        "emission_counts": _raw(counts, "<u4"),
        "emission_deltas_type": deltas_type,
        "emission_deltas_us": deltas,
        # One token per emission is the per-token recorder's case: say so instead of 4 B each.
        "emission_tokens": None if bool((tokens == 1).all()) else _raw(tokens, "<i4"),
    }
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def _count(body: dict[str, Any], name: str, maximum: int) -> int:
    value = body[name]
    if type(value) is not int or not 0 <= value <= maximum:
        raise WireError(name, f"must be an integer in [0, {maximum}], got {shown(value)}")
    return value


def _array(value: Any, name: str, wire_dtype: str, count: int, native: Any) -> npt.NDArray[Any]:
    """A raw little-endian column of ``count`` values, copied into an owned native array."""
    wire = np.dtype(wire_dtype)
    if not isinstance(value, bytes):
        raise WireError(name, f"expected raw bytes, got {type(value).__name__}")
    if len(value) != count * wire.itemsize:
        raise WireError(
            name,
            f"expected {count} x {wire.name} ({count * wire.itemsize} bytes), "
            f"got {len(value)} bytes",
        )
    return np.frombuffer(value, dtype=wire).astype(native)


def _strings(value: Any, name: str, count: int | None) -> list[str]:
    if not isinstance(value, list):
        raise WireError(name, f"expected an array of strings, got {type(value).__name__}")
    if count is not None and len(value) != count:
        raise WireError(name, f"expected {count} strings, got {len(value)}")
    # map/set run in C: a type check without Python bytecode per element.
    if not set(map(type, value)) <= {str}:
        raise WireError(name, "expected an array of strings, found another type")
    return value


def _label_column(value: Any, name: str, n: int) -> LabelColumn:
    column = require_map(value, name, LABEL_FIELDS)
    values = _strings(column["values"], f"{name}.values", None)
    return LabelColumn(values, _array(column["codes"], f"{name}.codes", "<u4", n, np.uint32))


def _offsets(body: dict[str, Any], starts: I64, counts: I64, m: int) -> I64:
    """Rebuild per-request offsets from deltas: one cumulative sum over the whole batch,
    restarted at each request by subtracting the previous request's total at its start."""
    kind = body["emission_deltas_type"]
    if type(kind) is not str or kind not in DELTA_TYPES:  # a list or map is not hashable
        raise WireError(
            "emission_deltas_type", f"unknown type {shown(kind)}; allowed: {list(DELTA_TYPES)}"
        )
    deltas: I64 = _array(
        body["emission_deltas_us"], "emission_deltas_us", DELTA_TYPES[kind], m, np.int64
    )
    if m == 0:
        return deltas
    if kind == "i64" and int(deltas.min()) < 0:
        raise WireError("emission_deltas_us", f"deltas must be >= 0, got {int(deltas.min())}")
    firsts = starts[:-1][counts > 0]
    if firsts.shape[0] > 1:
        totals = np.add.reduceat(deltas, firsts)
        deltas[firsts[1:]] -= totals[:-1]
    np.cumsum(deltas, out=deltas)
    # int64 deltas can sum past 2**63; the first wrapped offset of a request is negative.
    if kind == "i64" and int(deltas.min()) < 0:
        raise WireError("emission_deltas_us", "token times overflow int64 µs after arrival")
    return deltas


def unpack_body(body_bytes: bytes | memoryview) -> tuple[BatchHeader, RecordBatch]:
    """Parse and shape-check a body; the caller runs :func:`check_batch` on the result."""
    body = require_map(unpack(body_bytes, "body"), "body", BODY_FIELDS, top_level=True)
    header = BatchHeader(body["exporter_id"], body["seq"], body["sent_time_ns"])
    n = _count(body, "num_records", MAX_RECORDS)
    m = _count(body, "num_emissions", MAX_EMISSIONS)
    request_ids = _strings(body["request_ids"], "request_ids", n)
    columns = {
        name: _array(body[name], name, wire, n, RECORD_COLUMNS[name])
        for name, wire in WIRE_DTYPES.items()
        if name != "final"
    }
    final_bytes = _array(body["final"], "final", "<u1", n, np.uint8)
    if n and int(final_bytes.max()) > 1:
        raise WireError("final", f"values must be 0 or 1, got {int(final_bytes.max())}")
    phases = _array(body["phase_offsets_us"], "phase_offsets_us", "<i8", n * NUM_PHASES, np.int64)
    labels = require_map(body["labels"], "labels", LABEL_KEYS)
    counts = _array(body["emission_counts"], "emission_counts", "<u4", n, np.int64)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    if int(starts[-1]) != m:
        raise WireError("emission_counts", f"sum to {int(starts[-1])}, num_emissions is {m}")
    # The deltas' bytes are checked against m before anything of size m is allocated: a
    # count the body does not carry can never size an array.
    offsets = _offsets(body, starts, counts, m)
    tokens_value = body["emission_tokens"]
    tokens = (
        np.ones(m, dtype=np.int32)
        if tokens_value is None
        else _array(tokens_value, "emission_tokens", "<i4", m, np.int32)
    )
    batch = RecordBatch(
        request_ids=request_ids,
        labels={key: _label_column(labels[key], f"labels.{key}", n) for key in LABEL_KEYS},
        reason=_label_column(body["reason"], "reason", n),
        final=final_bytes.astype(np.bool_),
        phase_offsets_us=phases.reshape(n, NUM_PHASES),
        emission_starts=starts,
        emission_offsets_us=offsets,
        emission_tokens=tokens,
        **columns,
    )
    return header, batch
