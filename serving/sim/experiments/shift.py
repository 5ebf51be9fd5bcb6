"""A workload shift mid-run, and how long attainment takes to recover from it.

:func:`shift_inputs` is a workload transform: from ``at_s`` on, every prompt is ``factor``
times longer (short prompts → long prompts), the output lengths and arrival times
unchanged — so the same request rate suddenly needs ``factor`` times the prefill work and
holds ``factor`` times the KV per sequence. A scaled prompt is capped so that prompt plus
output still fits ``max_context_tokens`` (an instance's KV capacity), so the shift never
turns requests into errors. Prefix block ids (Mooncake) are kept as they were: the cached
prefix of a scaled prompt is its old one.

:func:`recovery_s` reads a run's per-request verdicts in arrival-time buckets after the
shift: the time from the shift to the start of the first bucket from which every later
bucket meets the target (0 when none missed it; ``inf`` when the last one misses).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from serving.sim.cluster import Workload

__all__ = ["bucket_attainment", "recovery_s", "shift_inputs"]

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]


def shift_inputs(
    work: Workload, at_s: float, factor: float, *, max_context_tokens: int | None = None
) -> Workload:
    """``work`` with prompts arriving at or after ``at_s`` multiplied by ``factor``."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor: must be a finite number > 0, got {factor!r}")
    if not math.isfinite(at_s):
        raise ValueError(f"at_s: must be a finite number, got {at_s!r}")
    after = work.arrival_s >= at_s
    prompts = work.prompt_tokens.copy()
    scaled = np.maximum(np.rint(prompts[after] * factor).astype(np.int64), 1)
    if max_context_tokens is not None:
        room = np.maximum(max_context_tokens - work.output_tokens[after], 1)
        scaled = np.minimum(scaled, room)
    prompts[after] = scaled
    return Workload(
        arrival_s=work.arrival_s,
        prompt_tokens=prompts,
        output_tokens=work.output_tokens,
        hash_ids=work.hash_ids,
        trace_rows=work.trace_rows,
        name=f"{work.name}+shift(x{factor:g}@{at_s:g}s)",
    )


def bucket_attainment(
    arrival_s: F64, good: B, judged: B, *, start_s: float, end_s: float, bucket_s: float
) -> tuple[F64, F64]:
    """``(bucket start times, attainment per bucket)`` over ``[start_s, end_s)``; a bucket
    with nothing judged has attainment 1.0 (nothing was served badly)."""
    if not (bucket_s > 0):
        raise ValueError(f"bucket_s: must be > 0, got {bucket_s!r}")
    num = max(math.ceil((end_s - start_s) / bucket_s - 1e-9), 0)
    starts = start_s + bucket_s * np.arange(num, dtype=np.float64)
    rows = (arrival_s >= start_s) & (arrival_s < end_s)
    index = ((arrival_s[rows] - start_s) // bucket_s).astype(np.int64)
    index = np.minimum(index, max(num - 1, 0))
    judged_n = np.bincount(index, weights=judged[rows].astype(np.float64), minlength=num)
    good_n = np.bincount(index, weights=good[rows].astype(np.float64), minlength=num)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(judged_n > 0, good_n / np.maximum(judged_n, 1.0), 1.0)
    return starts, ratio[:num]


def recovery_s(
    arrival_s: F64,
    good: B,
    judged: B,
    *,
    shift_s: float,
    end_s: float,
    target: float,
    bucket_s: float = 10.0,
) -> float:
    """Seconds from ``shift_s`` until attainment stays at or above ``target`` (module
    docstring)."""
    starts, ratio = bucket_attainment(
        arrival_s, good, judged, start_s=shift_s, end_s=end_s, bucket_s=bucket_s
    )
    missed = np.flatnonzero(ratio < target)
    if not missed.size:
        return 0.0
    last = int(missed[-1])
    if last == len(ratio) - 1:
        return math.inf
    return float(starts[last + 1] - shift_s)
