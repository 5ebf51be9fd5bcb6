"""Benchmark: window queries of the live goodput engine after an hour of traffic.

Fills a :class:`GoodputEngine` with 100 SLOs and 1 h of history at 10 k requests/s (one
batch of 10 k finished requests per simulated second; --quick: 10 min at 2 k/s), then
times ``query(slo, window)`` for random SLOs and windows (10 s … 1 d and the 28-day
compliance window), ``summary()`` over all SLOs, and a Prometheus scrape.

Traffic: output lengths resampled from the Azure LLM inference trace (conversation),
streamed in chunks of 4–12 tokens (one ITL gap per chunk, as ``vllm bench serve`` counts
them), lognormal TTFT, a per-request decode pace with jitter, 3 % of requests failed,
aborted or rejected; labels: 4 models × 24 tenants. SLOs: one per (model, tenant) with
mixed TTFT / TPOT / ITL (max or p99) objectives, and one per model with an E2EL objective,
so each request is judged by two SLOs. Batches are ingested with ``validate=False`` (the
wire decoder validates them once, before the engine).

Baseline, measured in the same run: the exact recompute of one 1-minute query from the
stored raw batches (select rows, ``judge``, exact percentiles with numpy), against the
engine's median time for the same kind of query.

Run from the repo root: ``python benchmarks/goodput_query.py [--quick]``. The last line of
output is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from controlplane.goodput import GoodputCollector, GoodputEngine, SLOSpec  # noqa: E402
from exporters.latency import itl_gaps_s, request_latencies  # noqa: E402
from exporters.records import (  # noqa: E402
    LABEL_KEYS,
    NUM_PHASES,
    LabelColumn,
    RecordBatch,
    Status,
)
from exporters.slo import Metric, Objective, judge  # noqa: E402

TRACE = ROOT / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
TRACE_FALLBACK = Path("/work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")
MODELS = [f"model-{i}" for i in range(4)]
TENANTS = [f"tenant-{i}" for i in range(24)]
WINDOWS = ["10s", "1m", "5m", "1h", "1d", "compliance"]
T0 = 1_699_920_000  # a UTC midnight
NS = 1_000_000_000


def output_lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    path = TRACE if TRACE.exists() else TRACE_FALLBACK
    generated = np.loadtxt(path, delimiter=",", skiprows=1, usecols=2, dtype=np.int64)
    return np.maximum(1, rng.choice(generated, size=n, replace=True))


def template_batch(rng: np.random.Generator, n: int) -> RecordBatch:
    """n finished requests whose finish times fall in [0, 1 s) after the epoch."""
    tokens = output_lengths(rng, n)
    chunk = rng.integers(4, 13, size=n)
    emissions = -(-tokens // chunk)
    rows = np.repeat(np.arange(n), emissions)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(emissions, out=starts[1:])
    position = np.arange(rows.shape[0]) - starts[rows]
    per_emission = np.where(
        position == emissions[rows] - 1,
        tokens[rows] - chunk[rows] * (emissions[rows] - 1),
        chunk[rows],
    )
    pace_us = rng.lognormal(np.log(20_000), 0.4, size=n)  # per token
    gaps = pace_us[rows] * per_emission * rng.lognormal(0, 0.3, size=rows.shape[0])
    gaps[position == 0] = 0
    ttft_us = rng.lognormal(np.log(250_000), 0.7, size=n)
    cumulative = np.cumsum(gaps)
    offsets = (
        cumulative - (cumulative[starts[:-1]] - gaps[starts[:-1]])[rows] + ttft_us[rows]
    ).astype(np.int64)
    e2el_ns = offsets[starts[1:] - 1] * 1000
    finish_ns = rng.integers(0, NS, size=n)
    status = rng.choice(
        [Status.OK, Status.ERROR, Status.ABORTED, Status.REJECTED],
        size=n,
        p=[0.97, 0.01, 0.01, 0.01],
    ).astype(np.uint8)
    labels = {key: LabelColumn([""], np.zeros(n, dtype=np.uint32)) for key in LABEL_KEYS}
    labels["model"] = LabelColumn(MODELS, rng.integers(0, len(MODELS), n).astype(np.uint32))
    labels["tenant"] = LabelColumn(TENANTS, rng.integers(0, len(TENANTS), n).astype(np.uint32))
    batch = RecordBatch(
        request_ids=[f"r{i}" for i in range(n)],
        vantage=np.zeros(n, dtype=np.uint8),
        arrival_time_ns=finish_ns - e2el_ns,
        labels=labels,
        status=status,
        reason=LabelColumn([""], np.zeros(n, dtype=np.uint32)),
        final=np.ones(n, dtype=np.bool_),
        token_detail=np.zeros(n, dtype=np.uint8),
        phase_offsets_us=np.full((n, NUM_PHASES), -1, dtype=np.int64),
        kv_bytes=np.zeros(n, dtype=np.int64),
        prompt_tokens=np.zeros(n, dtype=np.int32),
        cached_tokens=np.zeros(n, dtype=np.int32),
        emission_starts=starts,
        emission_offsets_us=offsets,
        emission_tokens=per_emission.astype(np.int32),
    )
    batch.validate()
    return batch


def slo_specs() -> list[SLOSpec]:
    specs = []
    for i, (model, tenant) in enumerate((m, t) for m in MODELS for t in TENANTS):
        objectives = [Objective(Metric.TTFT, (0.3, 0.5, 1.0)[i % 3])]
        if i % 2:
            objectives.append(Objective(Metric.ITL, 0.4, "p99"))
        else:
            objectives.append(Objective(Metric.ITL, 0.8))
        if i % 4 == 0:
            objectives.append(Objective(Metric.TPOT, 0.03))
        specs.append(
            SLOSpec(
                id=f"slo-{i}", name=f"{model}/{tenant}", objectives=tuple(objectives),
                target=0.99, window_s=28 * 86400, selector={"model": model, "tenant": tenant},
            )
        )  # fmt: skip
    for model in MODELS:
        specs.append(
            SLOSpec(
                id=f"slo-{model}", name=model, objectives=(Objective(Metric.E2EL, 20.0),),
                target=0.95, window_s=28 * 86400, selector={"model": model},
            )
        )  # fmt: skip
    return specs


def shifted(batch: RecordBatch, second: int) -> RecordBatch:
    return dataclasses.replace(batch, arrival_time_ns=batch.arrival_time_ns + second * NS)


def exact_recompute(batches: list[RecordBatch], spec: SLOSpec) -> dict[str, float]:
    """The baseline: one window's stats recomputed from raw rows, exactly."""
    good = judged = 0
    values: dict[str, list[np.ndarray]] = {"ttft": [], "tpot": [], "e2el": [], "itl": []}
    for batch in batches:
        mask = np.ones(len(batch), dtype=np.bool_)
        for key, value in spec.selector.items():
            mask &= batch.labels[key].mask(value)
        sub = batch.take(mask)
        verdicts = judge(sub, spec.objectives)
        good += verdicts.num_good
        judged += verdicts.num_judged
        lat = request_latencies(sub, validate=False)
        ok = sub.status == Status.OK
        values["ttft"].append(lat.ttft_s[ok])
        values["tpot"].append(lat.tpot_s[ok])
        values["e2el"].append(lat.e2el_s[ok])
        gaps, rows = itl_gaps_s(sub, validate=False)
        values["itl"].append(gaps[ok[rows]])
    out = {"attainment": good / judged}
    for name, parts in values.items():
        joined = np.concatenate(parts)
        out.update({f"{name}_p{q}": float(np.nanpercentile(joined, q)) for q in (50, 90, 99)})
    return out


def percentile_ms(samples: list[float], q: float) -> float:
    return round(float(np.percentile(samples, q)) * 1e3, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="10 min at 2 k/s instead of 1 h at 10 k/s"
    )
    args = parser.parse_args()
    seconds, rate = (600, 2_000) if args.quick else (3600, 10_000)
    rng = np.random.default_rng(20231116)
    templates = [template_batch(rng, rate) for _ in range(8)]
    specs = slo_specs()
    clock = [float(T0)]
    engine = GoodputEngine(clock=lambda: clock[0])
    engine.set_slos(specs)

    ingest_s = 0.0
    emissions = 0
    recent: list[RecordBatch] = []
    for second in range(seconds):
        batch = shifted(templates[second % len(templates)], T0 + second)
        clock[0] = T0 + second + 1.0
        start = time.perf_counter()
        engine.ingest(batch, validate=False)
        ingest_s += time.perf_counter() - start
        emissions += batch.num_emissions
        recent = [*recent[-59:], batch]
    now = T0 + seconds - 0.5  # the 1-min window is then exactly the last 60 batches
    clock[0] = now

    pick = random.Random(7)
    samples: dict[str, list[float]] = {w: [] for w in WINDOWS}
    all_samples: list[float] = []
    for _ in range(300 if args.quick else 2000):
        spec, window = pick.choice(specs), pick.choice(WINDOWS)
        start = time.perf_counter()
        engine.query(spec.id, window, now)
        elapsed = time.perf_counter() - start
        samples[window].append(elapsed)
        all_samples.append(elapsed)

    start = time.perf_counter()
    summary = engine.summary(now)
    summary_s = time.perf_counter() - start
    registry = CollectorRegistry()
    registry.register(GoodputCollector(engine, clock=lambda: now))
    start = time.perf_counter()
    scrape_bytes = len(generate_latest(registry))
    scrape_s = time.perf_counter() - start

    spec = specs[1]
    start = time.perf_counter()
    exact = exact_recompute(recent, spec)
    baseline_s = time.perf_counter() - start
    stats = engine.query(spec.id, "1m", now)
    memory = engine.memory_bytes()
    result = {
        "benchmark": "goodput_query",
        "quick": args.quick,
        "slos": len(specs),
        "seconds": seconds,
        "requests": seconds * rate,
        "emissions": emissions,
        "ingest_s": round(ingest_s, 2),
        "ingest_ms_per_batch": round(ingest_s / seconds * 1e3, 2),
        "queries": len(all_samples),
        "p50_ms_by_window": {w: percentile_ms(s, 50) for w, s in samples.items() if s},
        "p99_ms_by_window": {w: percentile_ms(s, 99) for w, s in samples.items() if s},
        "summary_ms_100_slos": round(summary_s * 1e3, 2),
        "summary_slos": len(summary),
        "scrape_ms": round(scrape_s * 1e3, 2),
        "scrape_bytes": scrape_bytes,
        "state_mb_per_slo": round(memory["slos"] / len(specs) / 2**20, 3),
        "dry_run_store_mb": round(memory["dry_run_store"] / 2**20, 1),
        "baseline_exact_1m_ms": round(baseline_s * 1e3, 1),
        "baseline_over_engine_1m": round(baseline_s / np.median(samples["1m"] or [1.0]), 1),
        "attainment_1m_engine": stats.attainment_ratio,
        "attainment_1m_exact": exact["attainment"],
        "ttft_p99_1m_engine": stats.ttft.p99_s,
        "ttft_p99_1m_exact": exact["ttft_p99"],
        "p99_ms": percentile_ms(all_samples, 99),
        "p50_ms": percentile_ms(all_samples, 50),
        "ingest_requests_per_s": round(seconds * rate / ingest_s),
        "state_mb": round(memory["slos"] / 2**20, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
