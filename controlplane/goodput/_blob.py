"""The rollup sketch blob: a minute's per-metric latency sketches in one versioned bytes.

Layout v1 (little-endian): ``b"GPRB"``, version (u8), number of metrics (u8), then per
metric its name (u8 length + ASCII) and its :meth:`LatencySketch.to_bytes` encoding (u32
length + bytes; each carries its own version and CRC). A reader ignores metrics it does
not know and treats missing ones as empty, so adding a metric needs no new version. The
empty blob (a store's default) decodes as empty sketches.
"""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt

from controlplane.goodput._batch import METRICS
from exporters.sketch import LatencySketch, SketchError

__all__ = ["decode_sketch_blob", "encode_sketch_blob", "rollup_sketches"]

I64 = npt.NDArray[np.int64]

_MAGIC = b"GPRB"
_VERSION = 1
_HEADER = struct.Struct("<4sBB")
_NAME = struct.Struct("<B")
_LENGTH = struct.Struct("<I")


def encode_sketch_blob(counts: I64 | None) -> bytes:
    """Encode ``(len(METRICS), NUM_BUCKETS)`` counts (``None``: all empty)."""
    parts = [_HEADER.pack(_MAGIC, _VERSION, len(METRICS))]
    for m, name in enumerate(METRICS):
        sketch = LatencySketch(None if counts is None else counts[m])
        encoded = sketch.to_bytes()
        parts += [_NAME.pack(len(name)), name.encode("ascii"), _LENGTH.pack(len(encoded)), encoded]
    return b"".join(parts)


def decode_sketch_blob(blob: bytes) -> I64:
    """The ``(len(METRICS), NUM_BUCKETS)`` counts of a blob; raise :class:`SketchError`
    naming what is wrong with a malformed one."""
    out: I64 = np.zeros((len(METRICS), LatencySketch.NUM_BUCKETS), dtype=np.int64)
    for name, sketch in _entries(bytes(blob)):
        if name in METRICS:
            out[METRICS.index(name)] += sketch.counts
    return out


def rollup_sketches(blob: bytes) -> dict[str, LatencySketch]:
    """The sketches of a :attr:`MinuteRollup.sketch_blob` by metric name (``"ttft"``,
    ``"tpot"``, ``"itl"``, ``"e2el"``); merge several minutes' with
    :meth:`LatencySketch.merge` to get percentiles over any range of history."""
    counts = decode_sketch_blob(blob)
    return {name: LatencySketch(counts[m]) for m, name in enumerate(METRICS)}


def _entries(blob: bytes) -> list[tuple[str, LatencySketch]]:
    if not blob:
        return []
    if len(blob) < _HEADER.size:
        raise SketchError(f"sketch blob: truncated, {len(blob)} bytes is shorter than its header")
    magic, version, count = _HEADER.unpack_from(blob)
    if magic != _MAGIC:
        raise SketchError(f"sketch blob: bad magic {magic!r}, expected {_MAGIC!r}")
    if version != _VERSION:
        raise SketchError(f"sketch blob: unsupported version {version}, expected {_VERSION}")
    entries: list[tuple[str, LatencySketch]] = []
    offset = _HEADER.size
    try:
        for _ in range(count):
            (name_length,) = _NAME.unpack_from(blob, offset)
            offset += _NAME.size
            name = blob[offset : offset + name_length].decode("ascii")
            offset += name_length
            (length,) = _LENGTH.unpack_from(blob, offset)
            offset += _LENGTH.size
            if offset + length > len(blob):
                raise SketchError(f"sketch blob: metric {name!r} runs past the end")
            entries.append((name, LatencySketch.from_bytes(blob[offset : offset + length])))
            offset += length
    except (struct.error, UnicodeDecodeError) as exc:
        raise SketchError(f"sketch blob: truncated or corrupt at byte {offset}: {exc}") from None
    if offset != len(blob):
        raise SketchError(f"sketch blob: {len(blob) - offset} trailing bytes after {count} metrics")
    return entries
