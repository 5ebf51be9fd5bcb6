"""The requests a simulation replays: a trace, rate-scaled and repeated to fill a duration.

:func:`build_workload` takes a :class:`~serving.traces.Trace`, starts ``start_s`` seconds
into it, divides its inter-arrival times by ``rate_scale`` (time compression) and repeats
it cycle after cycle until ``duration_s`` seconds of virtual time are filled, as the live
replay driver does. One cycle lasts the scaled trace plus one mean inter-arrival gap, so
cycles never overlap. Prefix-cache block ids are shifted by a per-cycle offset: a repeated
cycle is new content, so it does not hit the cache its previous cycle filled.

Example::

    work = build_workload(load_trace("azure_conv"), rate_scale=50, duration_s=3600)
    len(work), work.arrival_s[-1] < 3600
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from serving.traces import Trace, TraceError

__all__ = ["Workload", "build_workload"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests sorted by arrival: virtual seconds, prompt and output tokens (each
    ``>= 1``), prefix block ids where the trace has them, and which row of the trace
    (after ``start_s``) each one replays."""

    arrival_s: F64
    prompt_tokens: I64
    output_tokens: I64
    hash_ids: list[list[int]] | None
    trace_rows: I64
    name: str = ""

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])


def build_workload(
    trace: Trace, *, rate_scale: float, duration_s: float, start_s: float = 0.0
) -> Workload:
    """The requests arriving in ``[0, duration_s)`` (see the module docstring). Token
    counts of 0 in the trace are raised to 1: an engine request has both."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise TraceError(f"duration_s: must be a finite number > 0, got {duration_s!r}")
    if not (math.isfinite(rate_scale) and rate_scale > 0):
        raise TraceError(f"rate_scale: must be a finite number > 0, got {rate_scale!r}")
    base = trace
    if start_s and not (math.isfinite(start_s) and 0 <= start_s <= trace.duration_s):
        base = Trace(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), name=trace.name)
    elif start_s:
        base = trace.slice(start_s, trace.duration_s - start_s + 1.0)
    if not len(base):
        raise TraceError(
            f"{trace.name or 'trace'}: no request after start_s={start_s:g} s "
            f"(the trace lasts {trace.duration_s:g} s)"
        )
    arrivals = base.arrival_s / rate_scale
    n = len(base)
    gap = float(arrivals[-1]) / (n - 1) if n > 1 else 1.0 / rate_scale
    period = float(arrivals[-1]) + (gap if gap > 0 else 1.0 / rate_scale)
    cycles = max(1, math.ceil(duration_s / period))
    times = (arrivals[None, :] + period * np.arange(cycles)[:, None]).ravel()
    keep = int(np.searchsorted(times, duration_s, side="left"))
    rows = np.tile(np.arange(n, dtype=np.int64), cycles)[:keep]
    cycle_of = np.repeat(np.arange(cycles, dtype=np.int64), n)[:keep]
    hash_ids: list[list[int]] | None = None
    if base.hash_ids is not None:
        stride = 1 + max((max(ids) for ids in base.hash_ids if ids), default=0)
        source = base.hash_ids
        hash_ids = [
            source[r] if not c else [h + c * stride for h in source[r]]
            for r, c in zip(rows.tolist(), cycle_of.tolist(), strict=True)
        ]
    return Workload(
        arrival_s=times[:keep].astype(np.float64),
        prompt_tokens=np.maximum(base.input_tokens[rows], 1),
        output_tokens=np.maximum(base.output_tokens[rows], 1),
        hash_ids=hash_ids,
        trace_rows=rows,
        name=trace.name,
    )
