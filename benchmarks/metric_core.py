"""Benchmark: vectorised SLO verdicts (judge + request_latencies) against the pure-Python reference.

Builds 100k requests (10k with --quick) whose output lengths are drawn from the Azure LLM
inference trace (conversation, column GeneratedTokens) and whose token times resemble PD
decode: lognormal TTFT, a per-request decode pace with jitter, rare stalls, some requests
streamed in multi-token chunks, a few SUMMARY-detail records and every status. Times
``judge()`` for a TTFT + TPOT + ITL(p99) + ITL(max) + E2EL objective set (latencies
included, batch validated) against ``exporters._reference.reference_judge`` on a subset of the
same rows (scaled per request), checks both agree, and measures the sketch on the ITL gaps:
bucket indices from float seconds (``bucket_index``) and, as the engine takes them, from
integer microseconds by table lookup (``bucket_index_us``), checked equal.

Run from the repo root: ``python benchmarks/metric_core.py [--quick]``. The last line of
output is one JSON object; ``reference_ratio`` = vectorised speed / reference speed;
``sketch_us_over_float`` = integer-µs bucket indexing speed / float-seconds speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from exporters._reference import reference_judge, reference_quantile_lower  # noqa: E402
from exporters.latency import itl_gaps_s, itl_gaps_us  # noqa: E402
from exporters.records import (  # noqa: E402
    LABEL_KEYS,
    NUM_PHASES,
    LabelColumn,
    Phase,
    RecordBatch,
    Status,
    TokenDetail,
)
from exporters.sketch import LatencySketch  # noqa: E402
from exporters.slo import Metric, Objective, judge  # noqa: E402

TRACE = ROOT / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
TRACE_FALLBACK = Path("/work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")

OBJECTIVES = (
    Objective(Metric.TTFT, 0.5),
    Objective(Metric.TPOT, 0.05),
    Objective(Metric.ITL, 0.1, "p99"),
    Objective(Metric.ITL, 0.5),
    Objective(Metric.E2EL, 20.0),
)


def output_lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    """Output token counts resampled from the Azure conversation trace."""
    path = TRACE if TRACE.exists() else TRACE_FALLBACK
    generated = np.loadtxt(path, delimiter=",", skiprows=1, usecols=2, dtype=np.int64)
    return rng.choice(generated, size=n, replace=True)


def make_batch(rng: np.random.Generator, n: int) -> RecordBatch:
    """A synthetic batch of ``n`` requests, built column by column (no per-request loop)."""
    tokens_out = output_lengths(rng, n)
    status = rng.choice(
        np.array([Status.OK, Status.ERROR, Status.ABORTED, Status.REJECTED], dtype=np.uint8),
        size=n,
        p=[0.96, 0.015, 0.015, 0.01],
    )
    tokens_out[status == Status.REJECTED] = 0
    # 15 % of requests stream in chunks of 4 tokens (one ITL gap per chunk, vLLM-bench style).
    chunk = np.where(rng.random(n) < 0.15, 4, 1)
    emissions = -(-tokens_out // chunk)  # ceil
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(emissions, out=starts[1:])
    m = int(starts[-1])
    row = np.repeat(np.arange(n), emissions)
    first = np.zeros(m, dtype=np.bool_)
    first[starts[:-1][emissions > 0]] = True

    ttft_us = rng.lognormal(np.log(0.18), 0.6, n) * 1e6
    pace_us = rng.lognormal(np.log(0.028), 0.35, n) * 1e6 * chunk  # per emission
    gaps = pace_us[row] * rng.gamma(8.0, 1.0 / 8.0, m)
    stall = rng.random(m) < 0.004  # prefill interference on the decode worker
    gaps[stall] += rng.uniform(0.1, 0.4, int(stall.sum())) * 1e6
    gaps[first] = ttft_us[row[first]]
    step_us = np.round(gaps).astype(np.int64)
    cum = np.cumsum(step_us)
    base = np.zeros(n, dtype=np.int64)
    nonempty = emissions > 0
    base[nonempty] = cum[starts[:-1][nonempty]] - step_us[starts[:-1][nonempty]]
    offsets_us = cum - base[row]

    emission_tokens = chunk[row].astype(np.int32)
    last = starts[1:][nonempty] - 1
    emission_tokens[last] = tokens_out[nonempty] - (emissions[nonempty] - 1) * chunk[nonempty]

    # 2 % come from a summary source: only the first token (1) and the last (the rest).
    summary = rng.random(n) < 0.02
    is_last = np.zeros(m, dtype=np.bool_)
    is_last[last] = True
    summary_at = summary[row]
    multi = summary_at & is_last & ~first
    emission_tokens[summary_at & first & ~is_last] = 1
    emission_tokens[multi] = tokens_out[row[multi]] - 1
    keep = ~summary_at | first | is_last
    kept_starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(row[keep], minlength=n), out=kept_starts[1:])

    phases = np.full((n, NUM_PHASES), -1, dtype=np.int64)
    phases[~nonempty, Phase.FINISHED] = rng.integers(1_000, 300_000, int((~nonempty).sum()))
    batch = RecordBatch(
        request_ids=[f"req-{i}" for i in range(n)],
        vantage=np.zeros(n, dtype=np.uint8),
        arrival_time_ns=np.arange(n, dtype=np.int64) * 10_000_000,
        labels={k: LabelColumn([""], np.zeros(n, dtype=np.uint32)) for k in LABEL_KEYS},
        status=status.astype(np.uint8),
        reason=LabelColumn([""], np.zeros(n, dtype=np.uint32)),
        final=np.ones(n, dtype=np.bool_),
        token_detail=np.where(summary, TokenDetail.SUMMARY, TokenDetail.FULL).astype(np.uint8),
        phase_offsets_us=phases,
        kv_bytes=np.zeros(n, dtype=np.int64),
        prompt_tokens=np.zeros(n, dtype=np.int32),
        cached_tokens=np.zeros(n, dtype=np.int32),
        emission_starts=kept_starts,
        emission_offsets_us=offsets_us[keep],
        emission_tokens=emission_tokens[keep],
    )
    batch.validate()
    assert (batch.output_tokens() == tokens_out).all()
    return batch


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k requests, fewer repeats")
    args = parser.parse_args()
    n = 10_000 if args.quick else 100_000
    n_ref = 500 if args.quick else 2_000
    repeats = 2 if args.quick else 3
    rng = np.random.default_rng(20231116)

    batch = make_batch(rng, n)
    verdicts = judge(batch, OBJECTIVES)
    judge_s = best_of(repeats, lambda: judge(batch, OBJECTIVES))

    subset = np.sort(rng.choice(n, size=n_ref, replace=False))
    records = list(batch.take(subset).records())
    good, met, judged = reference_judge(records, OBJECTIVES)
    agree = (
        verdicts.good[subset].tolist() == good
        and verdicts.met[subset].tolist() == met
        and verdicts.judged[subset].tolist() == judged
    )
    ref_s = best_of(repeats, lambda: reference_judge(records, OBJECTIVES))

    gaps_s, _ = itl_gaps_s(batch)
    sketch_s = best_of(repeats, lambda: LatencySketch.bucket_counts(gaps_s))
    gaps_us, _ = itl_gaps_us(batch, validate=False)
    index_s = best_of(repeats, lambda: LatencySketch.bucket_index(gaps_s))
    index_us_s = best_of(repeats, lambda: LatencySketch.bucket_index_us(gaps_us))
    same_index = bool(
        np.array_equal(LatencySketch.bucket_index_us(gaps_us), LatencySketch.bucket_index(gaps_s))
    )
    sketch = LatencySketch()
    sketch.add(gaps_s)
    sample = gaps_s[rng.choice(gaps_s.shape[0], size=min(200_000, gaps_s.shape[0]), replace=False)]
    sample_sketch = LatencySketch()
    sample_sketch.add(sample)
    rel_errors = []
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = reference_quantile_lower(sample.tolist(), q)
        rel_errors.append(abs(sample_sketch.quantile(q) - exact) / exact)

    verdicts_per_s = n / judge_s
    reference_per_s = n_ref / ref_s
    result = {
        "benchmark": "metric_core",
        "quick": args.quick,
        "requests": n,
        "emissions": batch.num_emissions,
        "objectives": len(OBJECTIVES),
        "judge_s": round(judge_s, 4),
        "verdicts_per_s": round(verdicts_per_s),
        "reference_requests": n_ref,
        "reference_verdicts_per_s": round(reference_per_s),
        "reference_ratio": round(verdicts_per_s / reference_per_s, 1),
        "agrees_with_reference": agree,
        "good_ratio": round(verdicts.num_good / max(1, verdicts.num_judged), 4),
        "sketch_values_per_s": round(gaps_s.shape[0] / sketch_s),
        "sketch_us_values_per_s": round(gaps_us.shape[0] / index_us_s),
        "sketch_us_over_float": round(index_s / index_us_s, 1),
        "sketch_us_agrees": same_index,
        "sketch_max_rel_error": round(max(rel_errors), 5),
        "sketch_bytes": len(sketch.to_bytes()),
    }
    print(json.dumps(result))
    if not agree:
        sys.exit("vectorised verdicts disagree with the reference")
    if not same_index:
        sys.exit("integer-µs sketch buckets disagree with the float path")


if __name__ == "__main__":
    main()
