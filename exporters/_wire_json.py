"""The JSON form of a version-1 batch, for debugging and hand-written clients.

Same content as the binary form, made readable: enum columns carry lower-case names
(``"gateway"``, ``"ok"``, ``"full"``), label columns carry one string per record, phases are
named, and each request's emissions are a nested list of µs offsets after arrival (absolute,
not deltas). Per-record Python work is accepted here; per-token work stays in C (list
flattening, ``np.array``). Private: the public entry points are in :mod:`exporters.wire`.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from itertools import chain, pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

from exporters._wire_schema import (
    INT64_MAX,
    MAX_EMISSIONS,
    BatchHeader,
    WireError,
    check_version,
    require_map,
)
from exporters.records import (
    LABEL_KEYS,
    LabelColumn,
    Phase,
    RecordBatch,
    Status,
    TokenDetail,
    Vantage,
)

INT32_MAX = 2**31 - 1
PHASE_NAMES: tuple[str, ...] = tuple(p.name.lower() for p in Phase)
ENUM_COLUMNS: dict[str, type[IntEnum]] = {
    "vantage": Vantage,
    "status": Status,
    "token_detail": TokenDetail,
}
# An integer column's dtype, smallest and largest allowed value.
IntSpec = tuple[type[np.generic], int, int]
OFFSETS: IntSpec = (np.int64, 0, INT64_MAX)
PHASE_OFFSETS: IntSpec = (np.int64, -1, INT64_MAX)
TOKENS: IntSpec = (np.int32, 1, INT32_MAX)
INT_COLUMNS: dict[str, IntSpec] = {
    "arrival_time_ns": (np.int64, -INT64_MAX - 1, INT64_MAX),
    "kv_bytes": (np.int64, 0, INT64_MAX),
    "prompt_tokens": (np.int32, 0, INT32_MAX),
    "cached_tokens": (np.int32, 0, INT32_MAX),
}
JSON_FIELDS: tuple[str, ...] = (
    "v",
    "exporter_id",
    "seq",
    "sent_time_ns",
    "request_ids",
    *ENUM_COLUMNS,
    *INT_COLUMNS,
    "final",
    "labels",
    "reason",
    "phase_offsets_us",
    "emission_offsets_us",
    "emission_tokens",
)


def _names(enum: type[IntEnum]) -> list[str]:
    return [member.name.lower() for member in enum]


def _split(values: npt.NDArray[Any], starts: list[int]) -> list[list[int]]:
    flat = values.tolist()
    return [flat[lo:hi] for lo, hi in pairwise(starts)]


def to_json(header: BatchHeader, batch: RecordBatch) -> dict[str, Any]:
    """The JSON object of a batch that :func:`check_batch` accepted."""
    starts = batch.emission_starts.tolist()
    tokens = batch.emission_tokens
    return {
        "v": header.version,
        "exporter_id": header.exporter_id,
        "seq": header.seq,
        "sent_time_ns": header.sent_time_ns,
        "request_ids": list(batch.request_ids),
        **{
            name: np.array(_names(enum))[getattr(batch, name)].tolist()
            for name, enum in ENUM_COLUMNS.items()
        },
        **{name: getattr(batch, name).tolist() for name in INT_COLUMNS},
        "final": batch.final.tolist(),
        "labels": {key: batch.labels[key].decode() for key in LABEL_KEYS},
        "reason": batch.reason.decode(),
        "phase_offsets_us": {
            name: batch.phase_offsets_us[:, k].tolist() for k, name in enumerate(PHASE_NAMES)
        },
        "emission_offsets_us": _split(batch.emission_offsets_us, starts),
        "emission_tokens": None if bool((tokens == 1).all()) else _split(tokens, starts),
    }


def _list(value: Any, name: str, count: int | None, item: type, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise WireError(name, f"expected a list of {what}, got {type(value).__name__}")
    if count is not None and len(value) != count:
        raise WireError(name, f"expected {count} values, got {len(value)}")
    # map/set run in C; `type(...) is` also keeps booleans out of integer columns.
    if not set(map(type, value)) <= {item}:
        raise WireError(name, f"expected a list of {what}")
    return value


def _ints(value: Any, name: str, count: int | None, spec: IntSpec) -> npt.NDArray[Any]:
    dtype, lo, hi = spec
    items = _list(value, name, count, int, "integers")
    if not items:
        return np.zeros(0, dtype=dtype)
    try:
        array = np.array(items, dtype=np.int64)
    except OverflowError:
        raise WireError(name, f"values must be in [{lo}, {hi}]") from None
    low, high = int(array.min()), int(array.max())
    if low < lo or high > hi:
        raise WireError(name, f"values must be in [{lo}, {hi}], got {low if low < lo else high}")
    return array.astype(dtype)


def _enum(value: Any, name: str, n: int, enum: type[IntEnum]) -> npt.NDArray[np.uint8]:
    column = LabelColumn.encode(_list(value, name, n, str, "strings"))
    allowed = _names(enum)
    unknown = [v for v in column.values if v not in allowed]
    if unknown:
        raise WireError(name, f"unknown value {unknown[0]!r}; allowed: {allowed}")
    table = np.array([allowed.index(v) for v in column.values], dtype=np.uint8)
    codes: npt.NDArray[np.uint8] = table[column.codes]
    return codes


def _nested(value: Any, name: str, n: int) -> tuple[list[Any], list[Sequence[Any]]]:
    rows = _list(value, name, n, list, "lists (one per request)")
    return list(chain.from_iterable(rows)), rows


def from_json(obj: Any, max_records: int) -> tuple[BatchHeader, RecordBatch]:
    """Parse and shape-check a JSON object; the caller runs :func:`check_batch` on it."""
    if not isinstance(obj, dict):
        raise WireError("batch", f"expected a JSON object, got {type(obj).__name__}")
    if "v" not in obj:
        raise WireError("v", "missing")
    check_version(obj["v"])
    obj = require_map(obj, "batch", JSON_FIELDS, top_level=True)
    header = BatchHeader(obj["exporter_id"], obj["seq"], obj["sent_time_ns"], obj["v"])
    request_ids = _list(obj["request_ids"], "request_ids", None, str, "strings")
    n = len(request_ids)
    if n > max_records:
        raise WireError("request_ids", f"{n} records exceed max_records {max_records}")
    labels = require_map(obj["labels"], "labels", LABEL_KEYS)
    phases = require_map(obj["phase_offsets_us"], "phase_offsets_us", PHASE_NAMES)
    flat_offsets, rows = _nested(obj["emission_offsets_us"], "emission_offsets_us", n)
    counts = np.fromiter(map(len, rows), dtype=np.int64, count=n)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    m = int(starts[-1])
    if m > MAX_EMISSIONS:
        raise WireError("emission_offsets_us", f"{m} emissions exceed {MAX_EMISSIONS}")
    if obj["emission_tokens"] is None:
        tokens = np.ones(m, dtype=np.int32)
    else:
        flat_tokens, token_rows = _nested(obj["emission_tokens"], "emission_tokens", n)
        mismatch = np.fromiter(map(len, token_rows), dtype=np.int64, count=n) != counts
        if mismatch.any():
            row = int(np.flatnonzero(mismatch)[0])
            raise WireError(
                "emission_tokens",
                f"request {request_ids[row]!r} has {len(token_rows[row])} token counts "
                f"for {int(counts[row])} emissions",
            )
        tokens = _ints(flat_tokens, "emission_tokens", m, TOKENS)
    final = _list(obj["final"], "final", n, bool, "booleans")
    ints = {name: _ints(obj[name], name, n, spec) for name, spec in INT_COLUMNS.items()}
    batch = RecordBatch(
        request_ids=request_ids,
        vantage=_enum(obj["vantage"], "vantage", n, Vantage),
        status=_enum(obj["status"], "status", n, Status),
        token_detail=_enum(obj["token_detail"], "token_detail", n, TokenDetail),
        arrival_time_ns=ints["arrival_time_ns"],
        kv_bytes=ints["kv_bytes"],
        prompt_tokens=ints["prompt_tokens"],
        cached_tokens=ints["cached_tokens"],
        final=np.array(final, dtype=np.bool_),
        labels={
            key: LabelColumn.encode(_list(labels[key], f"labels.{key}", n, str, "strings"))
            for key in LABEL_KEYS
        },
        reason=LabelColumn.encode(_list(obj["reason"], "reason", n, str, "strings")),
        phase_offsets_us=np.stack(
            [_ints(phases[p], f"phase_offsets_us.{p}", n, PHASE_OFFSETS) for p in PHASE_NAMES],
            axis=1,
        ).reshape(n, len(PHASE_NAMES)),
        emission_starts=starts,
        emission_offsets_us=_ints(flat_offsets, "emission_offsets_us", m, OFFSETS),
        emission_tokens=tokens,
    )
    return header, batch
