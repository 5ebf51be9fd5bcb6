"""The control loops against their baselines in the cluster simulator (issue 6).

For each trace (Azure code, Azure conversation, Mooncake) on a cluster of N Llama-3.1-8B
tp1 H100 instances: the knee without control (the highest rate scale at which some static
P:D split keeps attainment at the target, by bisection), the peak goodput, then every
contender at 1.5×, 2× and 3× the knee from that split, and the best static split at each
level (a sweep). Then a workload shift on Azure conversation (prompts ×4 from half-way),
and stability (role changes per hour at 0.8× the knee). Contenders: no control, the
Dynamo-style busy-threshold shedder, the Dynamo-style SLA planner (180 s and 10 s), our
planner alone, our admission control alone, and both together ("ours"; also with the
admission adapter's default 1-s sync), through the simulator's adapters
(``serving.sim.control.planner`` / ``.admission``). Last, a long-prompt scenario with no
knee (Azure code, prompts ×4: a share of them cannot meet the TTFT objective even on an
idle instance; ``serving.sim.experiments.infeasible``): the report says "no knee" and
compares no control, the threshold shedder and our admission (the SLO's ``infeasible``
choice ``admit`` and ``reject``, alone and with the planner) on goodput at fixed rates;
then the planner from other splits (the balanced one, 1 prefill) against the best static
split at each rate.

Last line, for ours (``others`` holds the same figures for every other contender):
``{"overload_goodput_ratio"`` (min over traces and levels of goodput ÷ peak goodput; goal
≥ 0.9), ``"shift_goodput_ratio"`` (min over the two phases of goodput ÷ the best static
split's in that phase; goal ≥ 0.9), ``"recovery_s"`` (goal ≤ 60), ``"vs_dynamo_ratio"``
(geometric mean over the overload cells of goodput ÷ the better Dynamo-style planner's),
``"role_changes_per_h"`` (max over traces), ``"overload_token_goodput_ratio"`` (min over
traces and levels of token goodput — good prompt + output tokens per second, by arrival —
÷ the peak token goodput), ``"overload_token_goodput_vs_ceiling"`` (the same ÷ the lower
of the peak and the offered token load; goal ≥ 0.9), ``"worst_class_availability"`` (min
over traces, levels and prompt-length classes — the quartiles of the trace's prompt
lengths — of admitted ÷ offered; goal ≥ 0.25), ``"worst_class_availability_ratio"`` (the
same class's availability ÷ its cell's overall availability; goal ≥ 0.5, the admission
rule's floor), ``"long_prompt_vs_best_static"`` (min over the long-prompt rates and the
planner's starts of ours' goodput, ``infeasible`` ``reject``, ÷ the best static split's
under the same admission; goal ≥ 0.9; ``long_prompt`` holds every ratio, the planner
alone's too)``, ...}``.

    python benchmarks/control_eval.py [--quick] [--out DIR] [--plots DIR]
    python benchmarks/control_eval.py [--quick] --long-prompts-only

``--quick``: 4 instances, 60-s overload runs, 120 s for the shift and stability (2-6
minutes on the shared 2-core machine at load 2-15); the full run: 8 instances, 120-s
overload runs, 240-s shift, 300-s stability (8 minutes there at load 2-14).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from controlplane.policies.admission import prompt_quartiles  # noqa: E402
from exporters.slo import Metric, Objective  # noqa: E402
from serving.sim.experiments.contenders import Contender, baseline_contenders  # noqa: E402
from serving.sim.experiments.experiments import (  # noqa: E402
    Capacity,
    OverloadCell,
    ShiftOutcome,
    ShiftSetup,
    StabilityOutcome,
    capacity,
    overload,
    stability,
    workload_shift,
)
from serving.sim.experiments.infeasible import (  # noqa: E402
    LONG_PROMPT_TRACE,
    LongPromptCell,
    LongPromptSetup,
    long_prompt_contenders,
    long_prompt_json,
    long_prompt_table,
    long_prompts,
)
from serving.sim.experiments.ours import OURS, control_contenders  # noqa: E402
from serving.sim.experiments.report import (  # noqa: E402
    class_table,
    overload_table,
    shift_table,
    stability_table,
    token_table,
)
from serving.sim.experiments.scenario import Scenario, cached_trace  # noqa: E402

TRACES = ("azure_code", "azure_conv", "mooncake")
LEVELS = (1.5, 2.0, 3.0)
SHIFT_TRACE = "azure_conv"
SHIFT_SLO = (Objective(Metric.TTFT, 1.0), Objective(Metric.ITL, 0.05))
#: Shift rates (× the long-prompt knee): the headline's, then a harder one, reported beside.
SHIFT_LOADS = (0.8, 0.95)


@dataclass(frozen=True, slots=True)
class Size:
    instances: int
    overload_s: float
    shift_s: float
    stability_s: float


QUICK = Size(instances=4, overload_s=60.0, shift_s=120.0, stability_s=120.0)
FULL = Size(instances=8, overload_s=120.0, shift_s=240.0, stability_s=300.0)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def prompt_classes(trace: str) -> tuple[int, ...]:
    """The evaluation's prompt-length classes for ``trace``: its prompt-length quartiles."""
    return prompt_quartiles(cached_trace(trace).input_tokens.tolist())


def worst_class(cell: OverloadCell, bounds: tuple[int, ...]) -> tuple[float, float]:
    """The lowest availability over ``cell``'s prompt classes, and it ÷ the cell's own."""
    counts = [k for k in cell.outcome.class_counts(bounds) if k.offered]
    worst = min((k.availability_ratio for k in counts), default=1.0)
    overall = 1.0 - cell.outcome.rejected_ratio
    return worst, (worst / overall if overall > 0 else 1.0)


def summarise(
    name: str,
    cells: list[OverloadCell],
    shift: list[ShiftOutcome],
    stable: list[StabilityOutcome],
) -> dict[str, float | str | None]:
    """The headline figures for contender ``name``."""
    mine = [c for c in cells if c.contender == name]
    best_dynamo: dict[tuple[str, float], float] = {}
    for c in cells:
        if c.contender.startswith("dynamo planner"):
            key = (c.trace, c.level)
            best_dynamo[key] = max(best_dynamo.get(key, 0.0), c.outcome.goodput_rps)
    vs = [
        c.outcome.goodput_rps / best_dynamo[(c.trace, c.level)]
        for c in mine
        if best_dynamo.get((c.trace, c.level), 0.0) > 0
    ]
    shifted = next((s for s in shift if s.contender == name), None)
    stab = [s.role_changes_per_h for s in stable if s.contender == name]
    worst = [worst_class(c, prompt_classes(c.trace)) for c in mine]
    return {
        "overload_goodput_ratio": round(min(c.goodput_ratio for c in mine), 4) if mine else None,
        "shift_goodput_ratio": round(min(shifted.phase_ratios), 4) if shifted else None,
        "recovery_s": _recovery(shifted),
        "vs_dynamo_ratio": round(g, 4) if (g := _geomean(vs)) is not None else None,
        "role_changes_per_h": round(max(stab), 2) if stab else None,
        "overload_token_goodput_ratio": (
            round(min(c.token_goodput_ratio for c in mine), 4) if mine else None
        ),
        "overload_token_goodput_vs_ceiling": (
            round(min(c.token_goodput_vs_ceiling for c in mine), 4) if mine else None
        ),
        "worst_class_availability": round(min(w for w, _ in worst), 4) if worst else None,
        "worst_class_availability_ratio": round(min(r for _, r in worst), 4) if worst else None,
    }


def _recovery(shifted: ShiftOutcome | None) -> float | str | None:
    """Seconds, ``"never"`` when attainment had not recovered by the end, or ``None``."""
    if shifted is None:
        return None
    return round(shifted.recovery_s, 1) if math.isfinite(shifted.recovery_s) else "never"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="4 instances, 60-s runs")
    parser.add_argument("--out", type=Path, help="write results.json and tables.md here")
    parser.add_argument("--plots", type=Path, help="write the PNG plots here")
    parser.add_argument("--traces", nargs="+", choices=TRACES, default=list(TRACES))
    parser.add_argument(
        "--long-prompts-only",
        action="store_true",
        help="run only the long-prompt scenario (its table; last line: its figures)",
    )
    args = parser.parse_args()
    size = QUICK if args.quick else FULL
    wall0 = time.perf_counter()
    if args.long_prompts_only:
        _long_prompts_only(size, wall0)
        return
    contenders: list[Contender] = [*baseline_contenders(), *control_contenders()]
    log(f"contenders: {[c.name for c in contenders]}")

    caps: dict[str, Capacity] = {}
    cells: list[OverloadCell] = []
    peaks: dict[str, float] = {}
    for trace in args.traces:
        t0 = time.perf_counter()
        scenario = Scenario(trace, size.instances, size.overload_s)
        cap = caps[trace] = capacity(scenario)
        log(
            f"{trace}: knee {cap.rate:.3f}x on {cap.split[0]}P:{cap.split[1]}D "
            f"({cap.num_runs} runs, {time.perf_counter() - t0:.0f} s)"
        )
        peak, trace_cells = overload(scenario, cap, contenders, levels=LEVELS)
        peaks[trace] = peak
        cells += trace_cells
        log(f"{trace}: overload done ({time.perf_counter() - t0:.0f} s)")

    t0 = time.perf_counter()
    shift_scenario = Scenario(SHIFT_TRACE, size.instances, size.shift_s, objectives=SHIFT_SLO)
    setup, shifts = workload_shift(shift_scenario, contenders, load=SHIFT_LOADS[0])
    harder = [
        workload_shift(shift_scenario, contenders, load=load, short=setup.short, long=setup.long)
        for load in SHIFT_LOADS[1:]
    ]
    log(f"shift done ({time.perf_counter() - t0:.0f} s)")

    t0 = time.perf_counter()
    stable: list[StabilityOutcome] = []
    for trace in args.traces:
        scenario = Scenario(trace, size.instances, size.stability_s)
        for contender in contenders:
            if contender.plans:
                stable.append(stability(scenario, caps[trace], contender))
    log(f"stability done ({time.perf_counter() - t0:.0f} s)")

    long_scenario, long_setup, long_cells = _long_prompts(size)

    tables = "\n\n".join(
        [
            overload_table(cells, caps, peaks),
            token_table(cells),
            class_table(cells, {t: prompt_classes(t) for t in caps}),
            shift_table(setup, shifts),
            *(shift_table(more_setup, more) for more_setup, more in harder),
            stability_table(stable),
            long_prompt_table(long_scenario, long_setup, long_cells),
        ]
    )
    log(tables)
    results = _results(size, caps, peaks, cells, setup, shifts, stable)
    results["shift_harder"] = [_shift_json(more_setup, more) for more_setup, more in harder]
    results["long_prompt"] = {
        **long_prompt_json(long_setup, long_cells),
        "runs": [
            {
                "rate_scale": c.rate,
                "contender": c.contender,
                "num_infeasible": c.num_infeasible,
                **c.outcome.row(),
            }
            for c in long_cells
        ],
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        (args.out / "tables.md").write_text(tables + "\n")
    if args.plots:
        from serving.sim.experiments.plots import write_plots

        for path in write_plots(
            args.plots, cells=cells, caps=caps, peaks=peaks, shifts=shifts, setup=setup
        ):
            log(f"wrote {path}")

    names = {c.name for c in contenders}
    headline: dict[str, object] = dict(summarise(OURS, cells, shifts, stable))
    headline["others"] = {
        name: summarise(name, cells, shifts, stable) for name in sorted(names - {OURS})
    }
    headline["peak_goodput_rps"] = {t: round(p, 3) for t, p in peaks.items()}
    headline["peak_token_goodput_tps"] = {
        t: round(next(c.peak_token_goodput_tps for c in cells if c.trace == t), 1) for t in peaks
    }
    headline["knee_rate_scale"] = {t: round(c.rate, 3) for t, c in caps.items()}
    headline["long_prompt"] = long_json = long_prompt_json(long_setup, long_cells)
    headline["long_prompt_vs_best_static"] = long_json["ours_vs_best_static"]
    headline["instances"] = size.instances
    headline["wall_s"] = round(time.perf_counter() - wall0, 1)
    print(json.dumps(headline))


def _long_prompts(size: Size) -> tuple[Scenario, LongPromptSetup, list[LongPromptCell]]:
    t0 = time.perf_counter()
    scenario = Scenario(LONG_PROMPT_TRACE, size.instances, size.overload_s)
    setup, cells = long_prompts(scenario, long_prompt_contenders())
    log(f"long prompts done ({time.perf_counter() - t0:.0f} s)")
    return scenario, setup, cells


def _long_prompts_only(size: Size, wall0: float) -> None:
    """``--long-prompts-only``: the long-prompt table, then one line of its figures."""
    scenario, setup, cells = _long_prompts(size)
    log(long_prompt_table(scenario, setup, cells))
    figures = long_prompt_json(setup, cells)
    headline = {
        "long_prompt_vs_best_static": figures["ours_vs_best_static"],
        "long_prompt": figures,
        "instances": size.instances,
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    print(json.dumps(headline))


def _results(
    size: Size,
    caps: dict[str, Capacity],
    peaks: dict[str, float],
    cells: list[OverloadCell],
    setup: ShiftSetup,
    shifts: list[ShiftOutcome],
    stable: list[StabilityOutcome],
) -> dict[str, object]:
    return {
        "size": dataclasses.asdict(size),
        "capacity": {
            t: {
                "split": list(c.split),
                "knee": c.rate,
                "knees": {f"{p}P:{d}D": k for (p, d), k in c.knees.items()},
                "peak_goodput_rps": peaks[t],
                "prompt_class_bounds": list(prompt_classes(t)),
                "runs": c.num_runs,
            }
            for t, c in caps.items()
        },
        "overload": [
            {
                "trace": c.trace,
                "level": c.level,
                "contender": c.contender,
                "goodput_ratio": round(c.goodput_ratio, 4),
                "token_goodput_ratio": round(c.token_goodput_ratio, 4),
                "token_goodput_vs_ceiling": round(c.token_goodput_vs_ceiling, 4),
                "offered_tokens_tps": round(c.outcome.offered_tokens_tps, 1),
                **c.outcome.row(),
                "classes": [
                    {
                        "prompt_tokens": [k.low, k.high],
                        "offered": k.offered,
                        "rejected": k.rejected,
                        "availability_ratio": round(k.availability_ratio, 4),
                    }
                    for k in c.outcome.class_counts(prompt_classes(c.trace))
                ],
            }
            for c in cells
        ],
        "shift": _shift_json(setup, shifts),
        "stability": [
            {
                "trace": s.trace,
                "contender": s.contender,
                "load": s.load,
                "role_changes_per_h": s.role_changes_per_h,
                "moved_jobs": s.outcome.moved_jobs,
                **s.outcome.row(),
            }
            for s in stable
        ],
    }


def _shift_json(setup: ShiftSetup, shifts: list[ShiftOutcome]) -> dict[str, object]:
    return {
        "load": setup.load,
        "rate_scale": setup.rate,
        "initial_split": list(setup.split),
        "short_knee": setup.short.rate,
        "long_knee": setup.long.rate,
        "runs": [
            {
                "contender": s.contender,
                "phase_goodput_rps": s.phase_goodput_rps,
                "best_static_rps": s.best_static_rps,
                "best_static_splits": [list(x) for x in s.best_static_splits],
                "phase_ratios": s.phase_ratios,
                "recovery_s": s.recovery_s,
                **s.outcome.row(),
            }
            for s in shifts
        ],
    }


if __name__ == "__main__":
    main()
