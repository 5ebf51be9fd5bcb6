"""Small PNG plots of an evaluation (matplotlib, Agg): goodput under overload per trace,
and attainment and goodput through the workload shift."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from serving.sim.experiments.experiments import (
    Capacity,
    OverloadCell,
    ShiftOutcome,
    ShiftSetup,
)
from serving.sim.experiments.shift import bucket_attainment

__all__ = ["write_plots"]


def write_plots(
    folder: Path,
    *,
    cells: Sequence[OverloadCell],
    caps: Mapping[str, Capacity],
    peaks: Mapping[str, float],
    shifts: Sequence[ShiftOutcome],
    setup: ShiftSetup,
) -> list[Path]:
    """``control_overload.png`` and ``control_shift.png`` in ``folder``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    traces = list(caps)
    fig, axes = plt.subplots(1, len(traces), figsize=(3.4 * len(traces), 3.6), squeeze=False)
    for ax, trace in zip(axes[0], traces, strict=True):
        names = list(dict.fromkeys(c.contender for c in cells if c.trace == trace))
        for name in names:
            mine = sorted(
                (c for c in cells if c.trace == trace and c.contender == name),
                key=lambda c: c.level,
            )
            ax.plot(
                [c.level for c in mine],
                [c.goodput_ratio for c in mine],
                marker="o",
                label=name,
                lw=1.2,
                ms=3,
            )
        ax.axhline(0.9, color="grey", ls="--", lw=0.8)
        ax.set_title(f"{trace} (peak {peaks[trace]:.1f} req/s)", fontsize=8)
        ax.set_xlabel("load (× knee)", fontsize=8)
        top = max((c.goodput_ratio for c in cells if c.trace == trace), default=1.0)
        ax.set_ylim(0, max(1.25, 1.08 * top))
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("goodput ÷ peak", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=min(len(labels), 4))
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    path = folder / "control_overload.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)

    if shifts:
        end = shifts[0].outcome.duration_s
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.0, 4.2), sharex=True)
        bucket = 10.0
        for s in shifts:
            out = s.outcome
            starts, ratio = bucket_attainment(
                out.arrival_s, out.good, out.judged, start_s=0.0, end_s=end, bucket_s=bucket
            )
            good = np.histogram(out.arrival_s[out.good], bins=np.append(starts, end))[0]
            top.step(starts, ratio, where="post", label=s.contender, lw=1.0)
            bottom.step(starts, good / bucket, where="post", lw=1.0)
        for ax in (top, bottom):
            ax.axvline(setup.shift_s, color="grey", ls="--", lw=0.8)
            ax.tick_params(labelsize=7)
        top.set_ylabel("attainment (10 s)", fontsize=8)
        top.set_ylim(0, 1.05)
        bottom.set_ylabel("goodput (req/s)", fontsize=8)
        bottom.set_xlabel(
            f"arrival time (s); prompts ×{setup.factor:g} from the dashed line", fontsize=8
        )
        top.legend(fontsize=6, loc="lower left")
        fig.tight_layout()
        path = folder / "control_shift.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written
