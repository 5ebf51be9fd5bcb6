"""Benchmark: what per-class rejections and the other vantage's sketches cost the rollups.

The traffic of ``benchmarks/goodput_vantage.py`` (100 SLOs, ``rate`` requests per simulated
second, 1 % rejected), into two engines that see the same requests:

* ``one_vantage``: the gateway's records only, rejections without a priority class — an
  SLO's minute holds one sketch blob and one class (``""``), what a minute held before
  the rollups carried classes and vantages;
* ``both_vantages``: every request recorded at both vantages, the rejections split between
  two priority classes — the worst case: a second sketch blob per minute and two classes.

The figure is the export of every held minute (``reemit_rollups``, the code path of
``rollups()``, which the live runtime stores each minute), timed alternately ``repeats``
times on each engine, and the rows' blob bytes. The upsert into the database is not timed.

Run from the repo root: ``python benchmarks/rollup_write.py [--quick]``. The last line of
output is one JSON object.
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
from benchmarks.goodput_vantage import both_vantages  # noqa: E402
from controlplane.goodput import GoodputEngine  # noqa: E402
from controlplane.goodput.stats import MinuteRollup  # noqa: E402
from exporters.records import LabelColumn, RecordBatch, Status  # noqa: E402


def with_two_classes(batch: RecordBatch) -> RecordBatch:
    """The batch with its rejected rows alternately in the classes ``sheddable`` and
    ``standard`` (the others keep no class)."""
    rejected = np.flatnonzero(batch.status == Status.REJECTED)
    codes = np.zeros(len(batch), dtype=np.uint32)
    codes[rejected] = 1 + (np.arange(rejected.shape[0]) % 2)
    priority = LabelColumn(["", "sheddable", "standard"], codes)
    return dataclasses.replace(batch, labels={**batch.labels, "priority": priority})


def fill(batches: list[RecordBatch], seconds: int) -> GoodputEngine:
    clock = [float(T0)]
    engine = GoodputEngine(clock=lambda: clock[0], other_vantage=True)
    engine.set_slos(slo_specs())
    for second in range(seconds):
        clock[0] = T0 + second + 1.0
        engine.ingest(shifted(batches[second % len(batches)], T0 + second), validate=False)
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 minutes of traffic, not 5")
    args = parser.parse_args()
    seconds, rate, repeats = (120, 2_000, 5) if args.quick else (300, 2_000, 9)
    rng = np.random.default_rng(20231116)
    gateway = [template_batch(rng, rate) for _ in range(8)]
    engines = {
        "one_vantage": fill(gateway, seconds),
        "both_vantages": fill([both_vantages(with_two_classes(b)) for b in gateway], seconds),
    }
    samples: dict[str, list[float]] = {name: [] for name in engines}
    rows: dict[str, list[MinuteRollup]] = {}
    for k in range(repeats):
        for name in list(engines) if k % 2 else reversed(list(engines)):
            start = time.perf_counter()
            rows[name] = list(engines[name].reemit_rollups(T0, T0 + seconds))
            samples[name].append(time.perf_counter() - start)
    result: dict[str, object] = {
        "benchmark": "rollup_write",
        "quick": args.quick,
        "slos": len(slo_specs()),
        "requests_per_s": rate,
        "minutes": seconds // 60,
    }
    for name, engine_rows in rows.items():
        blobs = [len(r.sketch_blob) + len(r.other_sketch_blob) for r in engine_rows]
        result[name] = {
            "rows": len(engine_rows),
            "export_ms": round(statistics.median(samples[name]) * 1e3, 2),
            "blob_bytes_per_row": round(statistics.mean(blobs)),
            "classes_per_row": round(
                statistics.mean(len(r.rejected_by_class) for r in engine_rows), 2
            ),
        }
    one, both = result["one_vantage"], result["both_vantages"]
    assert isinstance(one, dict) and isinstance(both, dict)
    result["export_ratio"] = round(both["export_ms"] / one["export_ms"], 3)
    result["bytes_ratio"] = round(both["blob_bytes_per_row"] / one["blob_bytes_per_row"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
