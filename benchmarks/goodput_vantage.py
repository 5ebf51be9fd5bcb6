"""Benchmark: what the other vantage's latency sketches cost the goodput engine's ingest.

The traffic of ``benchmarks/goodput_query.py`` (100 SLOs judged at the gateway, 4 models ×
24 tenants), each request recorded at both vantages as a real fleet does (the gateway's
record and the worker's, same labels and timings), ``rate`` requests per simulated second.
Two engines ingest the same batches, alternately within the same run, one with
``other_vantage=True`` (percentiles per vantage) and one without; the figures are the
median ingest time per simulated second of each, their ratio, and the state each holds.
Two shapes of traffic, each on fresh engines: ``mixed``, one batch of both vantages' records
a second (the worst case: every SLO selects rows at both), and ``per_exporter``, the
gateway's batch then the worker's (as each exporter ships its own records).

Run from the repo root: ``python benchmarks/goodput_vantage.py [--quick]``. The last line
of output is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
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


def only_engine(batch: RecordBatch) -> RecordBatch:
    """The same records seen by the worker (engine vantage)."""
    return dataclasses.replace(batch, vantage=np.ones(len(batch), dtype=np.uint8))


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


def measure(batches: list[list[RecordBatch]], seconds: int) -> dict[str, object]:
    """Ingest ``batches[second % len]`` each second into both engines, alternately."""
    clock = [float(T0)]
    engines = {
        "on": GoodputEngine(clock=lambda: clock[0], other_vantage=True),
        "off": GoodputEngine(clock=lambda: clock[0], other_vantage=False),
    }
    for engine in engines.values():
        engine.set_slos(slo_specs())
    samples: dict[str, list[float]] = {name: [] for name in engines}
    for second in range(seconds):
        parts = [shifted(b, T0 + second) for b in batches[second % len(batches)]]
        clock[0] = T0 + second + 1.0
        order = list(engines) if second % 2 else list(reversed(engines))
        for name in order:
            start = time.perf_counter()
            for part in parts:
                engines[name].ingest(part, validate=False)
            samples[name].append(time.perf_counter() - start)
    on, off = (statistics.median(samples[k]) * 1e3 for k in ("on", "off"))
    now = T0 + seconds - 0.5
    per_vantage = engines["on"].vantage_percentiles(slo_specs()[1].id, "1m", now)
    return {
        "ingest_ms_per_s_other_vantage": round(on, 2),
        "ingest_ms_per_s_own_vantage_only": round(off, 2),
        "ingest_ratio": round(on / off, 3),
        "state_mb_other_vantage": round(engines["on"].memory_bytes()["slos"] / 2**20, 1),
        "state_mb_own_vantage_only": round(engines["off"].memory_bytes()["slos"] / 2**20, 1),
        "ttft_p99_1m_gateway": per_vantage["gateway"]["ttft"].p99_s,
        "ttft_p99_1m_engine": per_vantage["engine"]["ttft"].p99_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 min at 2 k/s, not 10 min")
    args = parser.parse_args()
    seconds, rate = (120, 2_000) if args.quick else (600, 2_000)
    rng = np.random.default_rng(20231116)
    gateway = [template_batch(rng, rate) for _ in range(8)]
    mixed = [[both_vantages(b)] for b in gateway]
    per_exporter = [[b, only_engine(b)] for b in gateway]
    result = {
        "benchmark": "goodput_vantage",
        "quick": args.quick,
        "slos": len(slo_specs()),
        "seconds": seconds,
        "requests_per_s": rate,
        "mixed": measure(mixed, seconds),
        "per_exporter": measure(per_exporter, seconds),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
