"""DistServe's result in the cluster simulator: disaggregation wins tight SLOs, colocation loose.

DistServe (Zhong et al., OSDI 2024) measures *goodput* — the highest request rate at which
at least 90 % of requests meet both a TTFT and a TPOT objective — and finds that
prefill/decode disaggregation beats colocated serving (vLLM) when the SLOs are tight,
because a colocated instance stalls its decodes behind every prefill, while colocation
wins when they are loose, because one pool of GPUs batches both phases without the
imbalance of a fixed split.

This script replays a shared trace at a grid of request rates on 8 H100s serving
Llama-3.1-8B (tp 1) in ``goodput sim``'s simulator, with the same seed, arrivals and GPU
count for every configuration:

* colocated, 8 instances, ``continuous`` batching: vLLM V0 without chunked prefill,
  DistServe's baseline — a prefill iteration of whole prompts takes priority and every
  running decode waits for it;
* colocated, 8 instances, ``chunked`` prefill with a 512- and a 2048-token budget per
  iteration (vLLM V1 / Sarathi-Serve): decodes ride along with prompt chunks;
* prefill/decode disaggregated, splits 1:7 to 5:3 (chunked scheduler, 8192 tokens; KV
  over NVLink inside the node).

Each run's records are judged (``exporters.slo.judge``, the goodput engine's own rules)
against DistServe-style SLOs scaled together: TTFT <= scale x 0.25 s and TPOT <= scale x
10 ms, for scales from 1 (tight) to 6 (loose); and, as a second family, TTFT <= scale x
0.25 s and each request's p99 inter-token gap <= scale x 12.5 ms (a stall shows in the
gaps even when the mean, TPOT, hides it). Goodput of a configuration at a scale is
the rate where its attainment first falls below 90 %, interpolated linearly between grid
rates (the top grid rate, marked, if it never does). The baseline of the comparison is
the colocated vLLM-V0 configuration of the same run.

Last stdout line: one JSON object — per trace and scale (``by_scale``: TPOT family,
``by_scale_itl``: ITL family), goodput per GPU of every configuration, the best PD split
and the best colocated one, and their ratio; the attainment curves. With
``--plots DIR`` writes ``distserve_<trace>.png`` there.

    python benchmarks/distserve_curves.py [--quick] [--plots docs/experiments]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from exporters.latency import request_latencies  # noqa: E402
from exporters.records import RecordBatch, Status  # noqa: E402
from exporters.slo import Metric, Objective, judge  # noqa: E402
from serving.sim.cluster import (  # noqa: E402
    SimOptions,
    Simulator,
    build_workload,
    parse_cluster,
)
from serving.traces import load_trace  # noqa: E402

MODEL = "model=llama3.1-8b,gpu=h100,tp=1"
GPUS = 8
TTFT_S, TPOT_S = 0.25, 0.010  # scale 1: the tight end
ITL_P99_S = 0.0125  # the second SLO family: each request's p99 gap instead of its TPOT
SCALES = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
TARGET = 0.9  # DistServe's attainment goal
SEED = 1


@dataclass(frozen=True)
class Config:
    name: str
    cluster: str
    colocated: int
    family: str  # "pd", "colocated"


CONFIGS = (
    Config("colocated vLLM-V0 (no chunking)", f"{MODEL},strategy=continuous", GPUS, "colocated"),
    Config(
        "colocated chunked 512",
        f"{MODEL},strategy=chunked,max_batched_tokens=512",
        GPUS,
        "colocated",
    ),
    Config(
        "colocated chunked 2048",
        f"{MODEL},strategy=chunked,max_batched_tokens=2048",
        GPUS,
        "colocated",
    ),
    *(
        Config(f"PD {p}:{GPUS - p}", f"{MODEL},prefill={p},decode={GPUS - p}", 0, "pd")
        for p in (1, 2, 3, 4, 5)
    ),
)
BASELINE = CONFIGS[0].name
FAMILIES = ("attainment", "attainment_itl")


def objectives(scale: float) -> tuple[Objective, Objective]:
    return Objective(Metric.TTFT, TTFT_S * scale), Objective(Metric.TPOT, TPOT_S * scale)


def itl_objectives(scale: float) -> tuple[Objective, Objective]:
    return Objective(Metric.TTFT, TTFT_S * scale), Objective(Metric.ITL, ITL_P99_S * scale, "p99")


def run_point(trace_name: str, config: Config, rate: float, duration_s: float) -> dict[str, Any]:
    """One simulation at ``rate`` requests/s (whole cluster): attainment at every scale."""
    trace = load_trace(trace_name)
    base_rate = len(trace) / trace.duration_s
    spec = parse_cluster(config.cluster, colocated=config.colocated)
    work = build_workload(trace, rate_scale=rate / base_rate, duration_s=duration_s)
    options = SimOptions(
        objectives=objectives(1.0), slo_target=TARGET, seed=SEED, keep_records=True
    )
    result = Simulator(spec, work, options).run()
    assert result.records is not None
    batch = RecordBatch.concat(result.records)
    latencies = request_latencies(batch)
    attainment = {}
    for scale in SCALES:
        verdicts = judge(batch, objectives(scale), latencies)
        attainment[scale] = verdicts.num_good / verdicts.num_judged
        if scale == 1.0:
            # One maths: the goodput engine judged the same records at scale 1.
            assert verdicts.num_good == result.stats.good, (verdicts.num_good, result.stats)
    # The ITL family: every scale's objectives in one judge call (one sort of the gaps),
    # a request good at a scale when it is good and meets that scale's two objectives.
    both = judge(batch, [o for scale in SCALES for o in itl_objectives(scale)], latencies)
    ok = both.judged & (batch.status == Status.OK)
    attainment_itl = {
        scale: int((ok & both.met[:, 2 * k] & both.met[:, 2 * k + 1]).sum()) / both.num_judged
        for k, scale in enumerate(SCALES)
    }
    return {
        "rate": rate,
        "requests": result.num_requests,
        "attainment": attainment,
        "attainment_itl": attainment_itl,
        "ttft_p90_s": float(np.nanpercentile(latencies.ttft_s, 90)),
        "tpot_p90_s": float(np.nanpercentile(latencies.tpot_s, 90)),
        "preemptions": result.num_preemptions,
        "wall_s": result.wall_s,
    }


def goodput(
    points: list[dict[str, Any]], scale: float, key: str = "attainment"
) -> tuple[float, str | None]:
    """The rate where attainment first drops below the target (linear between grid
    rates), and ``None``; ``(top rate, "top")`` when it never does on the grid;
    ``(0, "below")`` when even the lowest rate misses (the goodput is then somewhere
    below the grid's lowest rate, not zero)."""
    previous = None
    for point in points:
        a = point[key][scale]
        if a < TARGET:
            if previous is None:
                return 0.0, "below"
            r0, a0 = previous["rate"], previous[key][scale]
            r1 = point["rate"]
            return r0 + (r1 - r0) * (a0 - TARGET) / (a0 - a), None
        previous = point
    return points[-1]["rate"], "top"


def summarise(
    curves: dict[str, list[dict[str, Any]]], key: str, slo: Callable[[float], dict[str, float]]
) -> dict[str, Any]:
    """Goodput per GPU of every configuration at every scale, from the attainment curves
    under ``key``; the best PD split and the best colocated configuration, and ratios."""
    table: dict[str, Any] = {}
    for scale in SCALES:
        per_gpu, capped, below = {}, [], []
        for name, points in curves.items():
            value, bound = goodput(points, scale, key)
            per_gpu[name] = value / GPUS
            if bound == "top":
                capped.append(name)
            elif bound == "below":
                below.append(name)
        pd = {n: v for n, v in per_gpu.items() if n.startswith("PD")}
        co = {n: v for n, v in per_gpu.items() if not n.startswith("PD")}
        best_pd = max(pd, key=lambda n: pd[n])
        best_co = max(co, key=lambda n: co[n])
        table[str(scale)] = {
            "ttft_s": TTFT_S * scale,
            **slo(scale),
            "goodput_per_gpu": per_gpu,
            "at_top_of_grid": capped,
            "below_grid": below,
            "best_pd": best_pd,
            "best_colocated": best_co,
            "pd_over_best_colocated": pd[best_pd] / co[best_co] if co[best_co] > 0 else math.inf,
            "pd_over_baseline": (
                pd[best_pd] / per_gpu[BASELINE] if per_gpu[BASELINE] > 0 else math.inf
            ),
            "winner": "pd" if pd[best_pd] > co[best_co] else "colocated",
        }
    return table


def plot(
    trace: str, curves: dict[str, list[dict[str, Any]]], table: dict[str, Any], out: Path
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    styles = {
        BASELINE: ("tab:red", "-", "o"),
        "colocated chunked 512": ("tab:orange", "-", "s"),
        "colocated chunked 2048": ("tab:brown", "-", "^"),
    }
    scales = list(SCALES)
    for name, (color, ls, marker) in styles.items():
        ys = [table[str(s)]["goodput_per_gpu"][name] for s in scales]
        ax.plot(scales, ys, color=color, linestyle=ls, marker=marker, label=name)
    best = [table[str(s)]["best_pd"] for s in scales]
    ys = [table[str(s)]["goodput_per_gpu"][b] for s, b in zip(scales, best, strict=True)]
    ax.plot(scales, ys, color="tab:blue", marker="D", linewidth=2.2, label="PD, best split")
    for s, y, b in zip(scales, ys, best, strict=True):
        ax.annotate(b.removeprefix("PD "), (s, y), textcoords="offset points", xytext=(4, 5))
    ax.set_xlabel(f"SLO scale (TTFT <= s x {TTFT_S:g} s, TPOT <= s x {TPOT_S * 1e3:g} ms)")
    ax.set_ylabel("goodput per GPU (req/s at 90 % attainment)")
    ax.set_title(f"{trace}: goodput vs SLO tightness, {GPUS} H100s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    for ax, scale in zip(axes[1:], (scales[0], scales[-2]), strict=True):
        for name, points in curves.items():
            if name.startswith("PD") and name != table[str(scale)]["best_pd"]:
                continue
            color = styles.get(name, ("tab:blue", "-", "D"))[0]
            marker = styles.get(name, ("tab:blue", "-", "D"))[2]
            xs = [p["rate"] / GPUS for p in points]
            ax.plot(
                xs,
                [p["attainment"][scale] for p in points],
                color=color,
                marker=marker,
                markersize=4,
                label=name,
            )
        ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("request rate per GPU (req/s)")
        ax.set_ylabel("SLO attainment")
        ax.set_title(
            f"scale {scale:g}: TTFT <= {TTFT_S * scale:g} s, TPOT <= {TPOT_S * scale * 1e3:g} ms"
        )
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper right" if scale == scales[0] else "lower left")
    fig.tight_layout()
    path = out / f"distserve_{trace}.png"
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="one trace, coarse grid, 60 s")
    parser.add_argument("--plots", type=Path, default=None, help="write PNGs into this folder")
    parser.add_argument("--traces", default=None, help="comma-separated (default per mode)")
    args = parser.parse_args()
    if args.quick:
        traces = ["azure_conv"]
        rates = [float(r) for r in range(20, 161, 20)]
        duration = 60.0
    else:
        traces = ["azure_conv", "azure_code"]
        rates = [5.0, 10.0, 15.0, *(float(r) for r in range(20, 171, 10))]
        duration = 180.0
    if args.traces:
        traces = args.traces.split(",")
    started = time.perf_counter()
    cpu0 = time.process_time()
    out: dict[str, Any] = {
        "gpus": GPUS,
        "model": MODEL,
        "duration_s": duration,
        "rates": rates,
        "slo_base": {"ttft_s": TTFT_S, "tpot_s": TPOT_S},
        "target": TARGET,
        "baseline": BASELINE,
        "traces": {},
    }
    for trace in traces:
        curves: dict[str, list[dict[str, Any]]] = {}
        for config in CONFIGS:
            points = []
            for rate in rates:
                point = run_point(trace, config, rate, duration)
                points.append(point)
                print(
                    f"{trace} {config.name:32s} {rate:6.1f} req/s  "
                    + " ".join(f"{point['attainment'][s]:.3f}" for s in SCALES)
                    + "  itl: "
                    + " ".join(f"{point['attainment_itl'][s]:.3f}" for s in SCALES)
                    + f"  ttft p90 {point['ttft_p90_s']:.3f} s tpot p90 "
                    f"{point['tpot_p90_s'] * 1e3:.1f} ms",
                    file=sys.stderr,
                    flush=True,
                )
                if all(point[k][s] < 0.5 for s in SCALES for k in FAMILIES):
                    break  # far past every knee: higher rates only cost time
            curves[config.name] = points
        table = summarise(curves, "attainment", lambda scale: {"tpot_s": TPOT_S * scale})
        table_itl = summarise(
            curves, "attainment_itl", lambda scale: {"itl_p99_s": ITL_P99_S * scale}
        )
        entry: dict[str, Any] = {"by_scale": table, "by_scale_itl": table_itl}
        if args.plots is not None:
            args.plots.mkdir(parents=True, exist_ok=True)
            entry["plot"] = str(plot(trace, curves, table, args.plots))
        entry["curves"] = {
            name: [
                {
                    "rate": p["rate"],
                    "attainment": {str(s): a for s, a in p["attainment"].items()},
                    "attainment_itl": {str(s): a for s, a in p["attainment_itl"].items()},
                    "ttft_p90_s": p["ttft_p90_s"],
                    "tpot_p90_s": p["tpot_p90_s"],
                }
                for p in points
            ]
            for name, points in curves.items()
        }
        out["traces"][trace] = entry
    out["wall_s"] = time.perf_counter() - started
    out["cpu_s"] = time.process_time() - cpu0
    out["quick"] = args.quick
    print(json.dumps(out))


if __name__ == "__main__":
    main()
