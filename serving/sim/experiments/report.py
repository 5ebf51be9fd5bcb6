"""Markdown tables of an evaluation (pasted into docs/experiments/control.md)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from serving.sim.experiments.experiments import (
    Capacity,
    OverloadCell,
    ShiftOutcome,
    ShiftSetup,
    StabilityOutcome,
)

__all__ = [
    "class_table",
    "overload_table",
    "shift_table",
    "stability_table",
    "token_table",
]


def _split(split: tuple[int, int]) -> str:
    return f"{split[0]}P:{split[1]}D"


def _pct(ratio: float) -> str:
    return f"{100.0 * ratio:.0f} %"


def overload_table(
    cells: Sequence[OverloadCell], caps: Mapping[str, Capacity], peaks: Mapping[str, float]
) -> str:
    """Per trace, per contender: goodput ÷ peak at each level (attainment, rejected)."""
    levels = sorted({c.level for c in cells})
    lines = [
        *_level_header("trace", levels, ""),
    ]
    for trace, cap in caps.items():
        names = list(dict.fromkeys(c.contender for c in cells if c.trace == trace))
        label = (
            f"{trace} (knee {cap.rate:.2f}× on {_split(cap.split)}, peak {peaks[trace]:.2f} req/s)"
        )
        for name in names:
            row = []
            for lvl in levels:
                cell = _cell(cells, trace, lvl, name)
                if cell is None:
                    row.append("–")
                    continue
                out = cell.outcome
                extra = f"{_split(out.split)}, " if name == "best static" else ""
                row.append(
                    f"**{cell.goodput_ratio:.2f}** ({extra}att {_pct(out.attainment_ratio)}, "
                    f"rej {_pct(out.rejected_ratio)})"
                )
            lines.append(f"| {label} | {name} | " + " | ".join(row) + " |")
            label = ""
        offered = []
        for lvl in levels:
            cell = next((c for c in cells if c.trace == trace and c.level == lvl), None)
            if cell is None or not peaks[trace]:
                offered.append("–")
            else:
                rps = cell.outcome.total.offered / cell.outcome.duration_s
                offered.append(f"{rps / peaks[trace]:.2f} ({rps:.1f} req/s)")
        lines.append("|  | *offered ÷ peak (all good)* | " + " | ".join(offered) + " |")
    return "\n".join(lines)


def _level_header(first: str, levels: Sequence[float], what: str) -> list[str]:
    """The header and rule of a table with one column per overload level."""
    return [
        f"| {first} | contender | " + " | ".join(f"{lvl:g}× knee{what}" for lvl in levels) + " |",
        "| --- | --- | " + " | ".join("---" for _ in levels) + " |",
    ]


def _cell(
    cells: Sequence[OverloadCell], trace: str, level: float, name: str
) -> OverloadCell | None:
    return next(
        (c for c in cells if c.trace == trace and c.level == level and c.contender == name),
        None,
    )


def token_table(cells: Sequence[OverloadCell]) -> str:
    """Per trace, per contender: token goodput ÷ the peak token goodput at each level,
    beside request goodput ÷ the peak goodput (the overload table's figure)."""
    levels = sorted({c.level for c in cells})
    lines = _level_header("trace", levels, ": tokens (requests)")
    for trace in dict.fromkeys(c.trace for c in cells):
        first = next(c for c in cells if c.trace == trace)
        label = f"{trace} (peak {first.peak_token_goodput_tps:,.0f} good tokens/s)"
        for name in dict.fromkeys(c.contender for c in cells if c.trace == trace):
            row = []
            for lvl in levels:
                cell = _cell(cells, trace, lvl, name)
                row.append(
                    "–"
                    if cell is None
                    else f"**{cell.token_goodput_ratio:.2f}** ({cell.goodput_ratio:.2f})"
                )
            lines.append(f"| {label} | {name} | " + " | ".join(row) + " |")
            label = ""
        offered = []
        for lvl in levels:
            cell = next((c for c in cells if c.trace == trace and c.level == lvl), None)
            if cell is None or not cell.peak_token_goodput_tps:
                offered.append("–")
            else:
                tps = cell.outcome.offered_tokens_tps
                offered.append(f"{tps / cell.peak_token_goodput_tps:.2f} ({tps:,.0f} tokens/s)")
        lines.append("|  | *offered ÷ peak (all good)* | " + " | ".join(offered) + " |")
    return "\n".join(lines)


def _bounds_label(bounds: tuple[int, ...]) -> str:
    edges = [f"≤ {bounds[0]:,}"] if bounds else ["all"]
    edges += [f"{a:,}–{b:,}" for a, b in itertools.pairwise(bounds)]
    if bounds:
        edges.append(f"> {bounds[-1]:,}")
    return " / ".join(edges)


def class_table(cells: Sequence[OverloadCell], bounds: Mapping[str, tuple[int, ...]]) -> str:
    """Per trace, per contender that rejects anything, per level: availability per
    prompt-length class (the trace's quartiles) and each class's share of the rejections."""
    levels = sorted({c.level for c in cells})
    lines = _level_header(
        "trace (prompt classes, tokens)", levels, ": availability (share of rejections)"
    )
    for trace in dict.fromkeys(c.trace for c in cells):
        label = f"{trace} ({_bounds_label(bounds[trace])})"
        for name in dict.fromkeys(c.contender for c in cells if c.trace == trace):
            mine = [c for c in cells if c.trace == trace and c.contender == name]
            if not any(c.outcome.total.rejected for c in mine):
                continue
            row = []
            for lvl in levels:
                cell = _cell(cells, trace, lvl, name)
                if cell is None:
                    row.append("–")
                    continue
                counts = cell.outcome.class_counts(bounds[trace])
                avail = "/".join(f"{100 * k.availability_ratio:.0f}" for k in counts)
                share = "/".join(f"{100 * k.rejected_share:.0f}" for k in counts)
                row.append(f"{avail} % ({share} %)")
            lines.append(f"| {label} | {name} | " + " | ".join(row) + " |")
            label = ""
    return "\n".join(lines)


def shift_table(setup: ShiftSetup, outcomes: Sequence[ShiftOutcome]) -> str:
    """Per contender: goodput per phase against the phase's best static split, recovery."""
    first = outcomes[0] if outcomes else None
    head = (
        f"Shift at {setup.shift_s:g} s: prompts ×{setup.factor:g}; rate {setup.rate:.3f}× "
        f"({setup.load:g} × the long-prompt knee {setup.long.rate:.3f}×); start split "
        f"{_split(setup.split)}"
    )
    if first is not None:
        s1, s2 = first.best_static_splits
        b1, b2 = first.best_static_rps
        head += (
            f"; best static: phase 1 {_split(s1)} {b1:.2f} req/s, "
            f"phase 2 {_split(s2)} {b2:.2f} req/s"
        )
    lines = [
        head,
        "",
        "| contender | phase 1 goodput (÷ best static) | phase 2 goodput (÷ best static) | "
        "recovery | role changes | rejected |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        r1, r2 = o.phase_ratios
        g1, g2 = o.phase_goodput_rps
        recovery = f"{o.recovery_s:.0f} s" if math.isfinite(o.recovery_s) else "never"
        lines.append(
            f"| {o.contender} | {g1:.2f} req/s (**{r1:.2f}**) | {g2:.2f} req/s (**{r2:.2f}**) | "
            f"{recovery} | {len(o.outcome.role_changes)} | {_pct(o.outcome.rejected_ratio)} |"
        )
    return "\n".join(lines)


def stability_table(outcomes: Sequence[StabilityOutcome]) -> str:
    """Per trace and planner: role changes per hour, requests held by moved instances and
    how many of them were dropped, attainment."""
    lines = [
        "| trace | contender | load | role changes / h | requests on moved instances | "
        "dropped | attainment |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in outcomes:
        out = s.outcome
        lines.append(
            f"| {s.trace} | {s.contender} | {s.load:g}× knee | {s.role_changes_per_h:.1f} | "
            f"{out.moved_jobs} | {out.dropped_jobs} | {_pct(out.attainment_ratio)} |"
        )
    return "\n".join(lines)
