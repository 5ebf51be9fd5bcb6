"""Columnar readers for the request traces in the shared folder.

A :class:`Trace` is a workload to replay: arrival times and token counts as numpy columns,
plus, where the trace has them, the prefix-cache block ids of each prompt. Readers:

- Azure LLM inference 2023 (Splitwise) CSV, ``TIMESTAMP,ContextTokens,GeneratedTokens``
  (wall-clock timestamps with 7 fractional digits): :func:`load_azure` (``"code"``,
  ``"conv"`` or a path);
- Mooncake JSONL, ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}`` (512-token
  prefix blocks): :func:`load_mooncake`;
- :func:`load_trace` by name (:data:`TRACE_NAMES`) or path (``.csv`` / ``.jsonl``).

Arrivals are re-based so that the first request arrives at 0 s, and sorted (stably) if the
file is not. Example::

    trace = load_trace("azure_conv").slice(600.0, 60.0).scaled(2.0)  # a minute at 2x rate
    rps = len(trace) / 60.0 * 2.0
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "TRACE_NAMES",
    "Trace",
    "TraceError",
    "load_azure",
    "load_mooncake",
    "load_trace",
    "parse_azure_csv",
    "parse_mooncake_jsonl",
    "shared_dir",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_KINDS = ("code", "conv")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
TRACE_NAMES: tuple[str, ...] = ("azure_code", "azure_conv", "mooncake")


class TraceError(ValueError):
    """A trace that cannot be read: the message names the file, the line and the field."""


def shared_dir() -> Path:
    """The shared asset folder: ``$GOODPUT_SHARED_DIR``, else ``shared/`` beside the repo."""
    env = os.environ.get("GOODPUT_SHARED_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared"


@dataclass(frozen=True, slots=True)
class Trace:
    """A replayable workload, one row per request, sorted by arrival.

    ``arrival_s`` is seconds after the trace's start (non-decreasing, ``>= 0``);
    ``input_tokens`` / ``output_tokens`` the prompt and generated lengths; ``hash_ids`` each
    prompt's prefix-cache block ids where the trace has them (Mooncake), else ``None``.
    """

    arrival_s: F64
    input_tokens: I64
    output_tokens: I64
    hash_ids: list[list[int]] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        n = self.arrival_s.shape[0]
        for field, column in (
            ("arrival_s", self.arrival_s),
            ("input_tokens", self.input_tokens),
            ("output_tokens", self.output_tokens),
        ):
            if column.ndim != 1 or column.shape[0] != n:
                raise TraceError(f"{field}: expected {n} values, got shape {column.shape}")
        if self.hash_ids is not None and len(self.hash_ids) != n:
            raise TraceError(f"hash_ids: expected {n} lists, got {len(self.hash_ids)}")
        if n and (float(self.arrival_s[0]) < 0 or (np.diff(self.arrival_s) < 0).any()):
            raise TraceError("arrival_s: must be >= 0 and non-decreasing")
        for field in ("input_tokens", "output_tokens"):
            if n and int(getattr(self, field).min()) < 0:
                raise TraceError(f"{field}: must be >= 0, got {int(getattr(self, field).min())}")

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def duration_s(self) -> float:
        """Time from 0 to the last arrival."""
        return float(self.arrival_s[-1]) if len(self) else 0.0

    def scaled(self, rate_scale: float) -> Trace:
        """The same requests at ``rate_scale`` times the rate (inter-arrival times divided)."""
        if not (math.isfinite(rate_scale) and rate_scale > 0):
            raise TraceError(f"rate_scale: must be a finite number > 0, got {rate_scale!r}")
        return Trace(
            self.arrival_s / rate_scale,
            self.input_tokens,
            self.output_tokens,
            self.hash_ids,
            self.name,
        )

    def slice(self, start_s: float, duration_s: float) -> Trace:
        """The requests arriving in ``[start_s, start_s + duration_s)``, with arrivals
        relative to ``start_s`` (so the window's idle lead-in is kept)."""
        if not (math.isfinite(start_s) and start_s >= 0):
            raise TraceError(f"start_s: must be a finite number >= 0, got {start_s!r}")
        if not (math.isfinite(duration_s) and duration_s > 0):
            raise TraceError(f"duration_s: must be a finite number > 0, got {duration_s!r}")
        lo, hi = np.searchsorted(self.arrival_s, [start_s, start_s + duration_s], side="left")
        return Trace(
            self.arrival_s[lo:hi] - start_s,
            self.input_tokens[lo:hi],
            self.output_tokens[lo:hi],
            None if self.hash_ids is None else self.hash_ids[lo:hi],
            self.name,
        )


def _trace(
    name: str,
    arrival: F64,
    inputs: I64,
    outputs: I64,
    hash_ids: list[list[int]] | None,
) -> Trace:
    """Sort by arrival (stable, only if needed) and re-base so the first request is at 0."""
    if arrival.shape[0] and (np.diff(arrival) < 0).any():
        order = np.argsort(arrival, kind="stable")
        arrival, inputs, outputs = arrival[order], inputs[order], outputs[order]
        hash_ids = None if hash_ids is None else [hash_ids[i] for i in order.tolist()]
    start = float(arrival[0]) if arrival.shape[0] else 0.0
    return Trace(arrival - start, inputs, outputs, hash_ids, name)


def _ints(values: list[str], source: str, field: str, line_numbers: list[int]) -> I64:
    try:
        parsed = np.array(values, dtype=np.int64)
    except (ValueError, OverflowError):
        parsed = None
    if parsed is not None and not (parsed < 0).any():
        return parsed
    for number, value in zip(line_numbers, values, strict=True):  # find the culprit on failure
        if not value.strip().isdigit() or int(value) > 2**63 - 1:
            raise TraceError(f"{source}:{number}: {field}: expected an integer >= 0, got {value!r}")
    raise TraceError(f"{source}: {field}: unreadable integers")


def _times(stamps: list[str], source: str, line_numbers: list[int]) -> F64:
    """Seconds after the first timestamp, parsed by numpy in one call."""
    try:
        times = np.array(stamps, dtype="datetime64[ns]")
    except ValueError:
        for number, stamp in zip(line_numbers, stamps, strict=True):
            try:
                np.datetime64(stamp, "ns")
            except ValueError:
                raise TraceError(
                    f"{source}:{number}: TIMESTAMP: expected 'YYYY-MM-DD hh:mm:ss.fffffff', "
                    f"got {stamp!r}"
                ) from None
        raise TraceError(f"{source}: TIMESTAMP: unreadable timestamps") from None
    if not stamps:
        return np.zeros(0, dtype=np.float64)
    seconds: F64 = (times - times[0]).astype(np.int64) / 1e9
    return seconds


def parse_azure_csv(text: str, name: str = "azure") -> Trace:
    """A trace from the text of an Azure LLM inference CSV (``name`` names it in errors)."""
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != AZURE_HEADER:
        got = lines[0] if lines else ""
        raise TraceError(f"{name}:1: expected the header {AZURE_HEADER!r}, got {got!r}")
    numbers = [k + 1 for k, line in enumerate(lines) if k and line.strip()]
    rows = [lines[number - 1].split(",") for number in numbers]
    for number, row in zip(numbers, rows, strict=True):
        if len(row) != 3:
            raise TraceError(f"{name}:{number}: expected 3 comma-separated fields, got {row!r}")
    stamps, inputs, outputs = ([row[k] for row in rows] for k in range(3))
    return _trace(
        name,
        _times(stamps, name, numbers),
        _ints(inputs, name, "ContextTokens", numbers),
        _ints(outputs, name, "GeneratedTokens", numbers),
        None,
    )


def _mooncake_row(line: str, source: str, number: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise TraceError(f"{source}:{number}: invalid JSON ({exc})") from None
    if not isinstance(row, dict):
        raise TraceError(f"{source}:{number}: expected an object, got {type(row).__name__}")
    for key in MOONCAKE_FIELDS:
        value = row.get(key)
        if type(value) is not int or value < 0:
            raise TraceError(f"{source}:{number}: {key}: expected an integer >= 0, got {value!r}")
    blocks = row.get("hash_ids", [])
    if not isinstance(blocks, list) or not set(map(type, blocks)) <= {int}:
        raise TraceError(f"{source}:{number}: hash_ids: expected a list of integers")
    return row


def parse_mooncake_jsonl(text: str, name: str = "mooncake") -> Trace:
    """A trace from the text of a Mooncake JSONL trace (``timestamp`` in ms)."""
    rows = [
        _mooncake_row(line, name, k + 1) for k, line in enumerate(text.splitlines()) if line.strip()
    ]
    n = len(rows)

    def column(key: str) -> I64:
        return np.fromiter((row[key] for row in rows), dtype=np.int64, count=n)

    return _trace(
        name,
        column("timestamp").astype(np.float64) / 1e3,
        column("input_length"),
        column("output_length"),
        [row.get("hash_ids", []) for row in rows],
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None


def load_azure(source: str | Path) -> Trace:
    """The Azure trace ``"code"`` or ``"conv"`` from the shared folder, or a CSV at a path."""
    if isinstance(source, str) and source in AZURE_KINDS:
        path = shared_dir() / "traces" / "azure_llm_2023" / f"AzureLLMInferenceTrace_{source}.csv"
        return parse_azure_csv(_read(path), f"azure_{source}")
    path = Path(source)
    return parse_azure_csv(_read(path), path.stem)


def load_mooncake(path: str | Path | None = None) -> Trace:
    """The Mooncake JSONL trace at ``path`` (default: the shared synthetic trace)."""
    if path is None:
        file = shared_dir() / "traces" / "mooncake_synthetic" / "synthetic_trace.jsonl"
        return parse_mooncake_jsonl(_read(file), "mooncake")
    file = Path(path)
    return parse_mooncake_jsonl(_read(file), file.stem)


def load_trace(name_or_path: str | Path) -> Trace:
    """A trace by name (``azure_code``, ``azure_conv``, ``mooncake``) or by file path
    (``.csv`` read as Azure, ``.jsonl`` as Mooncake)."""
    if isinstance(name_or_path, str) and name_or_path in TRACE_NAMES:
        if name_or_path == "mooncake":
            return load_mooncake()
        return load_azure(name_or_path.removeprefix("azure_"))
    path = Path(name_or_path)
    if path.suffix == ".csv":
        return load_azure(path)
    if path.suffix == ".jsonl":
        return load_mooncake(path)
    raise TraceError(
        f"unknown trace {str(name_or_path)!r}: expected one of {list(TRACE_NAMES)} "
        "or a path ending in .csv (Azure) or .jsonl (Mooncake)"
    )
