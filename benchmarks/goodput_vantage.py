"""Benchmark: what the other vantage's latency sketches cost the goodput engine's ingest.

The traffic of ``benchmarks/goodput_query.py`` (100 SLOs judged at the gateway, 4 models ×
24 tenants), each request recorded at both vantages as a real fleet does (the gateway's
record and the worker's, same labels and timings): one batch of 2 × ``rate`` records per
simulated second. Two engines ingest the same batches, alternately within the same run,
one with ``other_vantage=True`` (percentiles per vantage) and one without; the figures
are the median ingest time per batch of each, their ratio, and the state each holds.

Run from the repo root: ``python benchmarks/goodput_vantage.py [--quick]``. The last line
of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.goodput_query import T0, shifted, slo_specs, template_batch  # noqa: E402
from controlplane.goodput import GoodputEngine  # noqa: E402
from exporters.records import LabelColumn, RecordBatch  # noqa: E402


def both_vantages(batch: RecordBatch) -> RecordBatch:
    """The batch's rows at the gateway, then the same rows at the engine vantage."""
    n, m = len(batch), batch.num_emissions

    def twice(a: np.ndarray) -> np.ndarray:
        return np.concatenate((a, a))

    return RecordBatch(
        request_ids=batch.request_ids * 2,
        vantage=np.concatenate((batch.vantage, np.ones(n, dtype=np.uint8))),
        arrival_time_ns=twice(batch.arrival_time_ns),
        labels={k: LabelColumn(c.values, twice(c.codes)) for k, c in batch.labels.items()},
        status=twice(batch.status),
        reason=LabelColumn(batch.reason.values, twice(batch.reason.codes)),
        final=twice(batch.final),
        token_detail=twice(batch.token_detail),
        phase_offsets_us=twice(batch.phase_offsets_us),
        kv_bytes=twice(batch.kv_bytes),
        prompt_tokens=twice(batch.prompt_tokens),
        cached_tokens=twice(batch.cached_tokens),
        emission_starts=np.concatenate((batch.emission_starts, batch.emission_starts[1:] + m)),
        emission_offsets_us=twice(batch.emission_offsets_us),
        emission_tokens=twice(batch.emission_tokens),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 min at 2 k/s, not 10 min")
    args = parser.parse_args()
    seconds, rate = (120, 2_000) if args.quick else (600, 2_000)
    rng = np.random.default_rng(20231116)
    templates = [both_vantages(template_batch(rng, rate)) for _ in range(8)]
    for t in templates:
        t.validate()
    clock = [float(T0)]
    engines = {
        "on": GoodputEngine(clock=lambda: clock[0], other_vantage=True),
        "off": GoodputEngine(clock=lambda: clock[0], other_vantage=False),
    }
    for engine in engines.values():
        engine.set_slos(slo_specs())
    samples: dict[str, list[float]] = {name: [] for name in engines}
    for second in range(seconds):
        batch = shifted(templates[second % len(templates)], T0 + second)
        clock[0] = T0 + second + 1.0
        order = list(engines) if second % 2 else list(reversed(engines))
        for name in order:
            start = time.perf_counter()
            engines[name].ingest(batch, validate=False)
            samples[name].append(time.perf_counter() - start)
    on, off = (statistics.median(samples[k]) * 1e3 for k in ("on", "off"))
    now = T0 + seconds - 0.5
    spec = slo_specs()[1]
    per_vantage = engines["on"].vantage_percentiles(spec.id, "1m", now)
    result = {
        "benchmark": "goodput_vantage",
        "quick": args.quick,
        "slos": len(slo_specs()),
        "seconds": seconds,
        "records_per_batch": 2 * rate,
        "ingest_ms_per_batch_other_vantage": round(on, 2),
        "ingest_ms_per_batch_own_vantage_only": round(off, 2),
        "ingest_ratio": round(on / off, 3),
        "state_mb_other_vantage": round(engines["on"].memory_bytes()["slos"] / 2**20, 1),
        "state_mb_own_vantage_only": round(engines["off"].memory_bytes()["slos"] / 2**20, 1),
        "ttft_p99_1m_gateway": per_vantage["gateway"]["ttft"].p99_s,
        "ttft_p99_1m_engine": per_vantage["engine"]["ttft"].p99_s,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
