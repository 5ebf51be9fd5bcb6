"""Shared pieces of the wire codecs: the version, the error type, the batch header, and the
once-per-batch check both encoders and both decoders run.

Private: import the public names from :mod:`exporters.wire`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from exporters.records import LABEL_KEYS, RecordBatch, RecordError

WIRE_VERSION: int = 1
SUPPORTED_VERSIONS: tuple[int, ...] = (1,)
MAX_EXPORTER_ID_CHARS = 256
INT64_MAX = 2**63 - 1
#: Documented maxima of one batch (docs/wire.md), checked before anything is allocated.
MAX_RECORDS = 100_000
MAX_EMISSIONS = 1 << 24

# Columns with one value per record: name -> the dtype RecordBatch holds (native endian).
RECORD_COLUMNS: dict[str, type[np.generic]] = {
    "vantage": np.uint8,
    "status": np.uint8,
    "token_detail": np.uint8,
    "final": np.bool_,
    "arrival_time_ns": np.int64,
    "kv_bytes": np.int64,
    "prompt_tokens": np.int32,
    "cached_tokens": np.int32,
}
# Count-like columns that must be >= 0 (RecordBatch.validate does not look at them).
NON_NEGATIVE_COLUMNS = ("kv_bytes", "prompt_tokens", "cached_tokens")


class WireError(ValueError):
    """A batch or command that cannot be encoded or decoded.

    ``field`` names the wire field (``"batch"`` for the message as a whole), ``reason`` says
    what is wrong and what is allowed; ``str(e) == f"{field}: {reason}"``. A decoder that
    raises it returns nothing: there is no partial result.
    """

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """Who sent a batch and where it sits in that exporter's sequence.

    ``(exporter_id, seq)`` identifies a batch: an exporter numbers its batches 0, 1, 2, ...
    and resends a batch with the same ``seq`` until it is acknowledged, so delivery is
    at-least-once and the receiver drops a pair it has already seen. ``sent_time_ns`` is the
    sender's wall clock when it encoded the batch (for lag and clock-skew monitoring).

    Example::

        header = BatchHeader(exporter_id="gw-0", seq=41, sent_time_ns=1_700_000_000_000_000_000)
    """

    exporter_id: str
    seq: int
    sent_time_ns: int
    version: int = WIRE_VERSION

    def __post_init__(self) -> None:
        eid = self.exporter_id
        if not isinstance(eid, str) or not 0 < len(eid) <= MAX_EXPORTER_ID_CHARS:
            raise WireError(
                "exporter_id",
                f"must be a non-empty string of at most {MAX_EXPORTER_ID_CHARS} characters, "
                f"got {shown(eid)}",
            )
        for name in ("seq", "sent_time_ns"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= INT64_MAX:
                raise WireError(name, f"must be an integer in [0, 2**63 - 1], got {shown(value)}")
        check_version(self.version)


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error never echoes a large input."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} characters)"


def check_version(version: object) -> int:
    """Return ``version`` if this build reads it, else raise naming the supported ones."""
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise WireError(
            "v",
            f"unsupported wire version {shown(version)}; "
            f"supported versions: {list(SUPPORTED_VERSIONS)}",
        )
    return version


def require_map(
    obj: Any, field: str, keys: tuple[str, ...], *, top_level: bool = False
) -> dict[str, Any]:
    """``obj`` as a map holding exactly ``keys`` (a newer writer's extra field is an error:
    fields are added by bumping the wire version, never silently ignored). A missing key is
    reported as ``field.key``, or as ``key`` for a ``top_level`` message."""
    if not isinstance(obj, dict):
        raise WireError(field, f"expected a map, got {type(obj).__name__}")
    prefix = "" if top_level else f"{field}."
    for key in keys:
        if key not in obj:
            raise WireError(f"{prefix}{key}", "missing")
    if len(obj) != len(keys):
        unknown = [k for k in obj if k not in keys]
        raise WireError(field, f"unknown fields {unknown!r}; allowed: {list(keys)}")
    return obj


def _check_dtype(
    name: str, array: npt.NDArray[np.generic], dtype: type[np.generic], ndim: int = 1
) -> None:
    if not isinstance(array, np.ndarray):
        raise WireError(
            name, f"expected a numpy array of {np.dtype(dtype)}, got {type(array).__name__}"
        )
    if not np.can_cast(array.dtype, dtype, casting="safe"):
        raise WireError(name, f"expected dtype {np.dtype(dtype)}, got {array.dtype}")
    if array.ndim != ndim:
        raise WireError(name, f"expected a {ndim}-D array, got {array.ndim}-D")


def check_batch(batch: RecordBatch) -> None:
    """Validate a batch once, as both codecs require: dtypes, then ``RecordBatch.validate()``,
    then the count columns and phase offsets. Raise :class:`WireError`.

    Vectorised: the cost is a few numpy passes over the emissions and C-level type checks
    of the strings; no Python bytecode per record or per token.
    """
    if not isinstance(batch, RecordBatch):
        raise WireError("batch", f"expected a RecordBatch, got {type(batch).__name__}")
    # set(map(type, ...)) runs in C: no Python bytecode per record.
    if not isinstance(batch.request_ids, list) or not set(map(type, batch.request_ids)) <= {str}:
        raise WireError("request_ids", "must be a list of strings")
    for name, dtype in RECORD_COLUMNS.items():
        _check_dtype(name, getattr(batch, name), dtype)
    _check_dtype("phase_offsets_us", batch.phase_offsets_us, np.int64, ndim=2)
    _check_dtype("emission_starts", batch.emission_starts, np.int64)
    _check_dtype("emission_offsets_us", batch.emission_offsets_us, np.int64)
    _check_dtype("emission_tokens", batch.emission_tokens, np.int32)
    if not isinstance(batch.labels, dict) or set(batch.labels) != set(LABEL_KEYS):
        keys = sorted(batch.labels) if isinstance(batch.labels, dict) else batch.labels
        raise WireError("labels", f"expected the keys {list(LABEL_KEYS)}, got {keys!r}")
    for name, column in (
        *((f"labels.{k}", c) for k, c in batch.labels.items()),
        ("reason", batch.reason),
    ):
        if not isinstance(column.values, list) or not set(map(type, column.values)) <= {str}:
            raise WireError(name, "dictionary values must be a list of strings")
        _check_dtype(name, column.codes, np.uint32)
    try:
        batch.validate()
    except RecordError as exc:
        field, _, reason = str(exc).partition(": ")
        raise WireError(field, reason) from None
    for name in NON_NEGATIVE_COLUMNS:
        column = getattr(batch, name)
        if len(batch) and int(column.min()) < 0:
            raise WireError(name, f"must be >= 0, got {int(column.min())}")
    lowest = int(batch.phase_offsets_us.min()) if len(batch) else 0
    if lowest < -1:
        raise WireError(
            "phase_offsets_us", f"must be >= 0 (µs after arrival) or -1 (absent), got {lowest}"
        )
