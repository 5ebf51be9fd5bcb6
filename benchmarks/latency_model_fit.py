"""Fit errors of the timing model's step curves, against the no-knee baseline, and the cost
of evaluating them.

Usage: ``python benchmarks/latency_model_fit.py [--quick]``

For every H100 profile, on the same profile points (``shared/profiles``, built as
``serving/sim/calibration/fit.py`` builds them), the committed curves (a roofline knee) are
scored against a baseline fitted in the same run: the same points, the same fixed
attention coefficients, no knee — the simple form ``a + b·N + c·ΣL²`` / ``a + b·B + k·C``.
Errors are relative (MAPE and max over every point, fitted and held out).

It also times ``LatencyModel.decode_steps_s`` over an array of steps against a Python loop
of ``decode_step_s`` (what a simulator would otherwise do per step), best of rounds.

The last printed line is one JSON object: per-profile MAPE and max error of both forms, the
worst of each, and the evaluation speed-up (``vectorised_speedup``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from serving.sim import LatencyModel  # noqa: E402
from serving.sim.calibrated import committed_calibration  # noqa: E402
from serving.sim.calibration._splitwise import (  # noqa: E402
    SPLITWISE_CSV,
    SPLITWISE_MODEL,
    SPLITWISE_TPS,
    splitwise_samples,
    splitwise_tp,
)
from serving.sim.calibration.fit import LAYER_SOURCES, layer_steps  # noqa: E402
from serving.sim.calibration.fitting import Samples, fit_curve  # noqa: E402
from serving.sim.calibration.profiles import read_layers_csv, read_splitwise_csv  # noqa: E402
from serving.sim.coefficients import StepCurve, profile_name  # noqa: E402
from serving.sim.models import get_model  # noqa: E402
from serving.traces import shared_dir  # noqa: E402


def profile_points(profiles: Path) -> dict[str, tuple[Samples, Samples]]:
    """Prefill and decode points of every H100 profile, by profile name."""
    calibration = committed_calibration()
    points: dict[str, tuple[Samples, Samples]] = {}
    for source in LAYER_SOURCES:
        tp = source.tensor_parallel
        reduce = next((a for a in calibration.all_reduce if a.tensor_parallel == tp), None)
        shape = get_model(source.model)
        prefill, decode, _ = layer_steps(
            read_layers_csv(profiles / source.path), shape, reduce if tp > 1 else None
        )
        points[profile_name("h100", source.model, tp)] = (prefill, decode)
    name, hardware, model = SPLITWISE_MODEL
    rows = read_splitwise_csv(profiles / SPLITWISE_CSV, name, hardware)
    for tp in SPLITWISE_TPS:
        points[profile_name("h100", model, tp)] = splitwise_samples(splitwise_tp(rows, tp))
    return points


def errors(curve: StepCurve, samples: Samples) -> tuple[float, float]:
    rel = np.abs(curve.seconds(samples.x, samples.w) - samples.y) / samples.y
    return round(float(rel.mean()), 4), round(float(rel.max()), 4)


def time_evaluation(steps: int, rounds: int) -> dict[str, float]:
    model = LatencyModel.for_profile("h100-llama3.1-70b-tp4")
    rng = np.random.default_rng(0)
    batch = rng.integers(1, 256, size=steps)
    context = batch * rng.integers(100, 4000, size=steps)
    best_vector = best_loop = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        model.decode_steps_s(batch, context)
        best_vector = min(best_vector, time.perf_counter() - start)
        start = time.perf_counter()
        for b, c in zip(batch.tolist(), context.tolist(), strict=True):
            model.decode_step_s(b, c)
        best_loop = min(best_loop, time.perf_counter() - start)
    return {
        "vectorised_ns_per_step": round(1e9 * best_vector / steps, 1),
        "loop_ns_per_step": round(1e9 * best_loop / steps, 1),
        "vectorised_speedup": round(best_loop / best_vector, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer evaluation steps")
    parser.add_argument("--profiles", type=Path, default=shared_dir() / "profiles")
    args = parser.parse_args()

    result: dict[str, Any] = {"profiles": {}}
    worst = {"knee_mape": 0.0, "baseline_mape": 0.0, "knee_max": 0.0, "baseline_max": 0.0}
    for name, (prefill, decode) in profile_points(args.profiles).items():
        profile = LatencyModel.for_profile(name).profile
        row: dict[str, float] = {}
        for phase, curve, samples in (
            ("prefill", profile.prefill, prefill),
            ("decode", profile.decode, decode),
        ):
            baseline, _ = fit_curve(samples, attention_s=curve.per_attention_unit_s, max_knees=0)
            knee_mape, knee_max = errors(curve, samples)
            base_mape, base_max = errors(baseline, samples)
            row |= {
                f"{phase}_mape": knee_mape,
                f"{phase}_max": knee_max,
                f"{phase}_baseline_mape": base_mape,
                f"{phase}_baseline_max": base_max,
            }
            worst["knee_mape"] = max(worst["knee_mape"], knee_mape)
            worst["knee_max"] = max(worst["knee_max"], knee_max)
            worst["baseline_mape"] = max(worst["baseline_mape"], base_mape)
            worst["baseline_max"] = max(worst["baseline_max"], base_max)
        result["profiles"][name] = row
        print(
            f"{name:24} prefill MAPE {100 * row['prefill_mape']:5.2f} % "
            f"(no knee {100 * row['prefill_baseline_mape']:5.2f} %), max "
            f"{100 * row['prefill_max']:5.1f} % ({100 * row['prefill_baseline_max']:5.1f} %) | "
            f"decode MAPE {100 * row['decode_mape']:5.2f} % "
            f"({100 * row['decode_baseline_mape']:5.2f} %), max "
            f"{100 * row['decode_max']:5.1f} % ({100 * row['decode_baseline_max']:5.1f} %)"
        )
    result["worst"] = worst
    result |= time_evaluation(20_000 if args.quick else 200_000, 3 if args.quick else 5)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
