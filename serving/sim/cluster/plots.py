"""PNG plots of a simulation: TTFT and ITL CDFs, pool sizes and queue lengths over time.

matplotlib (Agg backend, no display) is imported when plotting, so the simulator runs
without it. The CDFs are drawn from the samples the record builder keeps (every
request's TTFT; the ITL gaps of every 16th request) with the SLO thresholds marked; the
report's percentiles come from the goodput engine, not from these samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from exporters.slo import Metric
from serving.sim.cluster.results import SimResult

__all__ = ["write_plots"]

F64 = npt.NDArray[np.float64]


def _cdf(ax: Any, values: F64, threshold_s: float | None, title: str) -> None:
    if values.shape[0]:
        ordered = np.sort(values) * 1e3
        ratio = np.arange(1, ordered.shape[0] + 1) / ordered.shape[0]
        ax.plot(ordered, ratio, linewidth=1.5)
        ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
    if threshold_s is not None:
        ax.axvline(threshold_s * 1e3, color="tab:red", linestyle="--", label="SLO")
        ax.legend(loc="lower right")
    ax.set_xlabel(f"{title} (ms)")
    ax.set_ylabel("fraction of samples")
    ax.set_title(f"{title} CDF")
    ax.grid(True, which="both", alpha=0.3)


def write_plots(result: SimResult, out_dir: Path) -> list[Path]:
    """Write ``ttft_cdf.png``, ``itl_cdf.png`` and ``pools.png`` into ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    thresholds = {
        o.metric: o.threshold_s for o in result.options.objectives if o.statistic == "max"
    }
    paths = []
    for name, values, metric, title in (
        ("ttft_cdf.png", result.ttft_s, Metric.TTFT, "TTFT"),
        ("itl_cdf.png", result.itl_sample_s, Metric.ITL, "ITL"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        _cdf(ax, values, thresholds.get(metric), title)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    series = result.series
    time_s = np.asarray(series.time_s)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for k, (pool, sizes) in enumerate(series.pool_size.items()):
        if any(sizes):
            color = f"C{k}"  # one colour per pool: queued solid, running dotted
            top.step(time_s, sizes, where="post", label=pool, color=color)
            bottom.plot(time_s, series.waiting[pool], label=f"{pool} queued", color=color)
            bottom.plot(
                time_s, series.running[pool], linestyle=":", label=f"{pool} running", color=color
            )
    top.set_ylabel("instances")
    top.set_title("pool sizes")
    top.legend(loc="upper right")
    bottom.set_ylabel("requests")
    bottom.set_xlabel("virtual time (s)")
    bottom.set_title("queued and running requests per pool")
    bottom.legend(loc="upper right", fontsize="small")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = out_dir / "pools.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths
