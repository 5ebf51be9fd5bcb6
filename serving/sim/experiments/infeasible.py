"""A long-prompt, bursty workload whose target no rate can meet (issue 13, item 5).

The Azure code trace (bursty arrivals) with every prompt ×``factor`` (4 by default: p50
1.5 k → 6 k tokens, up to 30 k), judged against the trace's own SLO (TTFT ≤ 0.5 s, ITL ≤
50 ms, target 0.95). About 13 % of its prompts take longer than the TTFT objective to
prefill on an idle instance, so without control attainment stays below the target at
every rate: **there is no knee**, and the knee-relative overload levels of the other
experiments do not exist. :func:`long_prompts` says so (every static split at the lightest
rates, none meeting the target) and compares the contenders on goodput at fixed rate
scales instead, beside the best static split at each rate.

The admission contenders run twice: with the SLO's ``infeasible`` choice ``admit`` (the
default: such requests are served as best effort, unjudged, counted apart) and ``reject``
(refused at once). Each cell also reports the requests the rule called infeasible
(``num_infeasible``) and the share of the offered requests whose idle TTFT exceeds the
objective by the profile's latency model (``infeasible_share``).

**Does the planner reach the best static split?** The contenders start from the best
static split, where the planner has nothing to find. So the planner also starts from the
other splits of :func:`planner_starts` (the balanced one and the most decode-heavy one):
ours (admission + planner, ``infeasible`` ``reject``) from each, against the best static
split *under the same admission* (``ours (admission only), infeasible reject`` on every
split, the best of them: ``BEST_STATIC_ADMISSION``), and the planner alone from each
start, against the best static split without control. :func:`long_prompt_vs_best_static`
gives the ratios (goal: ≥ 0.9 for ours).

Example::

    setup, cells = long_prompts(Scenario("azure_code", 4, 60.0), contenders)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from serving.sim.cluster import SimPolicy, Workload
from serving.sim.control.admission import SimAdmission
from serving.sim.control.baselines import static_splits
from serving.sim.control.planner import PlannerPolicy
from serving.sim.control.profile import profile_params
from serving.sim.experiments.contenders import (
    NO_CONTROL,
    THRESHOLD_SHEDDER,
    Combined,
    Contender,
)
from serving.sim.experiments.experiments import best_static
from serving.sim.experiments.ours import ADMISSION_INTERVAL_S, OURS
from serving.sim.experiments.run import RunOutcome, run_policy, scenario_workload
from serving.sim.experiments.scenario import Scenario
from serving.sim.experiments.shift import shift_inputs

__all__ = [
    "BEST_STATIC",
    "BEST_STATIC_ADMISSION",
    "LONG_PROMPT_FACTOR",
    "LONG_PROMPT_RATES",
    "LONG_PROMPT_TRACE",
    "LongPromptCell",
    "LongPromptSetup",
    "long_prompt_contenders",
    "long_prompt_json",
    "long_prompt_table",
    "long_prompt_verdict",
    "long_prompt_vs_best_static",
    "long_prompts",
    "planner_starts",
]

LONG_PROMPT_TRACE = "azure_code"
#: Every prompt of the trace this many times longer.
LONG_PROMPT_FACTOR = 4.0
#: The fixed rate scales (× the trace's own rate) the contenders are compared at.
LONG_PROMPT_RATES = (1.0, 2.0, 4.0, 8.0)
#: Lighter rates probed (with ``LONG_PROMPT_RATES[0]``) on every split for a knee.
KNEE_PROBES = (0.5,)
#: The best static split without control at each rate.
BEST_STATIC = "best static"
#: The best static split under our admission (``infeasible`` ``reject``) at each rate.
BEST_STATIC_ADMISSION = "best static, ours (admission only), infeasible reject"
#: The planner alone (no admission), as the reach runs name it.
PLANNER_ONLY = "ours (planner only)"
_OURS_REJECT = f"{OURS}, infeasible reject"


@dataclass(frozen=True, slots=True)
class LongPromptSetup:
    """The knee search's verdict: ``knee`` is ``None`` when no static split met the target
    at any rate probed (``probes``: ``(rate, split, attainment)``), and the split the
    contenders start from (the best static split's at the middle rate)."""

    factor: float
    knee: float | None
    probes: tuple[tuple[float, tuple[int, int], float], ...]
    split: tuple[int, int]
    target: float

    @property
    def best_probe(self) -> tuple[float, tuple[int, int], float]:
        return max(self.probes, key=lambda p: p[2])


@dataclass(frozen=True, slots=True)
class LongPromptCell:
    """One contender at one fixed rate scale."""

    rate: float
    contender: str
    outcome: RunOutcome
    infeasible_share: float  # offered requests whose idle TTFT exceeds the objective
    num_infeasible: dict[str, int] | None  # what the admission rule called infeasible


def _transform(scenario: Scenario, factor: float) -> Callable[[Workload], Workload]:
    max_context = scenario.max_context_tokens()

    def longer(work: Workload) -> Workload:
        return shift_inputs(work, 0.0, factor, max_context_tokens=max_context)

    return longer


def _infeasible_share(scenario: Scenario, split: tuple[int, int], work: Workload) -> float:
    """The share of ``work``'s requests (arriving within the run) whose prefill and KV
    hand-off alone, by the profile's latency model at the workload's mean prompt, exceed
    the TTFT objective: the rule's own prediction on an idle instance."""
    ttft = [o.threshold_s for o in scenario.objectives if o.metric.value == "ttft"]
    rows = work.arrival_s < scenario.duration_s
    if not ttft or not rows.any():
        return 0.0
    prompts = work.prompt_tokens[rows]
    params = profile_params(
        scenario.spec(split).profile,
        prompt_tokens=float(prompts.mean()),
        output_tokens=float(work.output_tokens[rows].mean()),
        decode_batch=1.0,
    )
    idle_s = prompts / params.prefill_tokens_per_s + params.kv_handoff_s
    return float(np.mean(idle_s > min(ttft)))


def _admission(infeasible: str) -> Contender:
    def build(scenario: Scenario, split: tuple[int, int]) -> SimAdmission:
        return SimAdmission(
            profile=scenario.spec(split).profile,
            objectives=scenario.objectives,
            interval_s=ADMISSION_INTERVAL_S,
            infeasible=infeasible,
        )

    return Contender(f"ours (admission only), infeasible {infeasible}", build)


def _ours(infeasible: str) -> Contender:
    gate = _admission(infeasible).make

    def build(scenario: Scenario, split: tuple[int, int]) -> Combined:
        admission = gate(scenario, split)
        assert admission is not None
        planner = PlannerPolicy(
            profile=scenario.spec(split).profile, objectives=scenario.objectives
        )
        return Combined(admission, planner)

    return Contender(f"{OURS}, infeasible {infeasible}", build, plans=True)


def _planner_only(scenario: Scenario, split: tuple[int, int]) -> PlannerPolicy:
    return PlannerPolicy(profile=scenario.spec(split).profile, objectives=scenario.objectives)


def _from(name: str, split: tuple[int, int]) -> str:
    return f"{name}, from {split[0]}P:{split[1]}D"


def planner_starts(num_instances: int, split: tuple[int, int]) -> list[tuple[int, int]]:
    """The splits the planner also starts from, besides the contenders' ``split``: the
    balanced one and the most decode-heavy one (1 prefill)."""
    half = num_instances // 2
    starts = [(half, num_instances - half), (1, num_instances - 1)]
    return [s for s in dict.fromkeys(starts) if s != split and min(s) >= 1]


def long_prompt_contenders() -> list[Contender]:
    """No control, the threshold shedder, and our admission (alone and with the planner)
    with each ``infeasible`` choice."""
    return [
        NO_CONTROL,
        THRESHOLD_SHEDDER,
        _admission("admit"),
        _admission("reject"),
        _ours("admit"),
        _ours("reject"),
    ]


def _rule_counts(policy: object) -> dict[str, int] | None:
    gate = policy.admission if isinstance(policy, Combined) else policy
    if isinstance(gate, SimAdmission):
        return dict(gate.rule.num_infeasible)
    return None


def long_prompts(
    scenario: Scenario,
    contenders: Sequence[Contender],
    *,
    factor: float = LONG_PROMPT_FACTOR,
    rates: Sequence[float] = LONG_PROMPT_RATES,
    reach: bool = True,
) -> tuple[LongPromptSetup, list[LongPromptCell]]:
    """The knee verdict and every contender (and the best static split) at each of
    ``rates``; with ``reach``, also the planner from the other starts and the best static
    split under our admission (see the module docstring)."""
    transform = _transform(scenario, factor)
    splits = static_splits(scenario.num_instances)
    probes: list[tuple[float, tuple[int, int], float]] = []
    for rate in (*KNEE_PROBES, rates[0]):
        for split in splits:
            out = run_policy(scenario, split, rate, None, name="static", transform=transform)
            probes.append((rate, split, out.attainment_ratio))
    met = [p for p in probes if p[2] >= scenario.target]
    # Attainment does not rise with load: a target missed at the lightest rates on every
    # split is missed at every rate (lighter still, too few requests arrive to judge).
    knee = max(p[0] for p in met) if met else None
    middle = rates[len(rates) // 2]
    sweep = best_static(scenario, middle, splits, transform=transform)
    split = sweep[0].split
    setup = LongPromptSetup(factor, knee, tuple(probes), split, scenario.target)
    cells: list[LongPromptCell] = []
    for rate in rates:
        work = scenario_workload(scenario, rate, transform)
        share = _infeasible_share(scenario, split, work)
        for contender in contenders:
            policy = contender.make(scenario, split)
            out = run_policy(
                scenario, split, rate, policy, name=contender.name, transform=transform
            )
            cells.append(LongPromptCell(rate, contender.name, out, share, _rule_counts(policy)))
        static = best_static(scenario, rate, splits, transform=transform)[0]
        cells.append(LongPromptCell(rate, BEST_STATIC, static, share, None))
        if reach:
            cells += _reach(scenario, split, rate, share, transform)
    return setup, cells


def _reach(
    scenario: Scenario,
    split: tuple[int, int],
    rate: float,
    share: float,
    transform: Callable[[Workload], Workload],
) -> list[LongPromptCell]:
    """Ours (``reject``) from the other starts, the planner alone from every start, and the
    best static split under our admission, at ``rate``."""
    cells: list[LongPromptCell] = []
    ours = _ours("reject")
    runs: list[tuple[str, tuple[int, int], SimPolicy | None]] = [
        (_from(ours.name, start), start, ours.make(scenario, start))
        for start in planner_starts(scenario.num_instances, split)
    ]
    runs += [
        (_from(PLANNER_ONLY, start), start, _planner_only(scenario, start))
        for start in (split, *planner_starts(scenario.num_instances, split))
    ]
    for name, start, policy in runs:
        out = run_policy(scenario, start, rate, policy, name=name, transform=transform)
        cells.append(LongPromptCell(rate, name, out, share, _rule_counts(policy)))
    gated: list[tuple[RunOutcome, dict[str, int] | None]] = []
    for static_split in static_splits(scenario.num_instances):
        gate = _admission("reject").make(scenario, static_split)
        out = run_policy(
            scenario, static_split, rate, gate, name=BEST_STATIC_ADMISSION, transform=transform
        )
        gated.append((out, _rule_counts(gate)))
    best, counts = max(gated, key=lambda g: g[0].goodput_rps)
    cells.append(LongPromptCell(rate, BEST_STATIC_ADMISSION, best, share, counts))
    return cells


def long_prompt_vs_best_static(cells: Sequence[LongPromptCell]) -> dict[str, list[float | None]]:
    """Per run of ours (``infeasible`` ``reject``, from each start) and of the planner
    alone: its goodput ÷ the best static split's at each rate (under the same admission for
    ours, without control for the planner alone); ``None`` where that best is 0."""
    rates = sorted({c.rate for c in cells})
    best = {(c.contender, c.rate): c.outcome.goodput_rps for c in cells}
    ratios: dict[str, list[float | None]] = {}
    for name in dict.fromkeys(c.contender for c in cells):
        if name == _OURS_REJECT or name.startswith(f"{_OURS_REJECT}, from "):
            reference = BEST_STATIC_ADMISSION
        elif name.startswith(f"{PLANNER_ONLY}, from "):
            reference = BEST_STATIC
        else:
            continue
        row: list[float | None] = []
        for rate in rates:
            base = best.get((reference, rate), 0.0)
            mine = best.get((name, rate))
            row.append(round(mine / base, 4) if mine is not None and base > 0 else None)
        if any(r is not None for r in row):
            ratios[name] = row
    return ratios


def _worst(ratios: Mapping[str, Sequence[float | None]], planner_only: bool) -> float | None:
    picked = [
        r
        for name, row in ratios.items()
        if name.startswith(PLANNER_ONLY) == planner_only
        for r in row
        if r is not None
    ]
    return min(picked) if picked else None


def long_prompt_verdict(setup: LongPromptSetup) -> str:
    """One sentence on the knee: its rate, or that there is none and why."""
    rate, split, best = setup.best_probe
    where = f"{split[0]}P:{split[1]}D at {rate:g}×"
    if setup.knee is not None:
        return f"knee at {setup.knee:g}× or above (best probe {where}: attainment {best:.3f})"
    lightest = min(p[0] for p in setup.probes)
    return (
        f"no knee: no static split meets attainment {setup.target:g} at any rate probed "
        f"(down to {lightest:g}×; best {where}: {best:.3f}), and attainment only falls "
        "as load grows: contenders are compared on goodput at fixed rates instead"
    )


def long_prompt_table(
    scenario: Scenario, setup: LongPromptSetup, cells: Sequence[LongPromptCell]
) -> str:
    """Per contender, at each fixed rate: goodput (attainment, rejected, and the requests
    the rule called infeasible: admitted / deferred / rejected)."""
    rates = sorted({c.rate for c in cells})
    objectives = ", ".join(f"{o.metric.value} ≤ {o.threshold_s:g} s" for o in scenario.objectives)
    lines = [
        f"Long prompts: {scenario.trace} with prompts ×{setup.factor:g}, {objectives}, "
        f"target {scenario.target:g}, {scenario.num_instances} instances, contenders from "
        f"{setup.split[0]}P:{setup.split[1]}D. {long_prompt_verdict(setup)}.",
        "",
        "| contender | " + " | ".join(f"{r:g}× trace rate" for r in rates) + " |",
        "| --- | " + " | ".join("---" for _ in rates) + " |",
    ]
    for name in dict.fromkeys(c.contender for c in cells):
        row = []
        for rate in rates:
            cell = next((c for c in cells if c.contender == name and c.rate == rate), None)
            if cell is None:
                row.append("–")
                continue
            out = cell.outcome
            best = name in (BEST_STATIC, BEST_STATIC_ADMISSION)
            extra = f"{out.split[0]}P:{out.split[1]}D, " if best else ""
            counts = cell.num_infeasible
            infeasible = (
                f", infeasible {counts['admit']}/{counts['defer']}/{counts['reject']}"
                if counts
                else ""
            )
            row.append(
                f"**{out.goodput_rps:.2f}** req/s ({extra}att {100 * out.attainment_ratio:.0f} %, "
                f"rej {100 * out.rejected_ratio:.0f} %{infeasible})"
            )
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    offered = []
    for rate in rates:
        cell = next(c for c in cells if c.rate == rate)
        rps = cell.outcome.total.offered / cell.outcome.duration_s
        offered.append(f"{rps:.2f} req/s, {100 * cell.infeasible_share:.0f} % infeasible")
    lines.append("| *offered* | " + " | ".join(offered) + " |")
    ratios = long_prompt_vs_best_static(cells)
    if ratios:
        at = " / ".join(f"{r:g}×" for r in rates)
        lines += ["", f"Goodput ÷ the best static split's, at {at}:", ""]
        for name, ratio_row in ratios.items():
            base = BEST_STATIC if name.startswith(PLANNER_ONLY) else BEST_STATIC_ADMISSION
            figures = " / ".join("–" if r is None else f"{r:.2f}" for r in ratio_row)
            lines.append(f"- {name} ÷ {base}: {figures}")
    return "\n".join(lines)


def long_prompt_json(setup: LongPromptSetup, cells: Sequence[LongPromptCell]) -> dict[str, object]:
    """The headline figures: the knee (``None``: no knee), goodput per contender at each
    fixed rate (req/s), the ratios of :func:`long_prompt_vs_best_static` and the lowest of
    them for ours (``ours_vs_best_static``) and for the planner alone
    (``planner_only_vs_best_static``)."""
    rates = sorted({c.rate for c in cells})
    ratios = long_prompt_vs_best_static(cells)
    return {
        "knee_rate_scale": setup.knee,
        "split": f"{setup.split[0]}P:{setup.split[1]}D",
        "rates": rates,
        "infeasible_share": [
            round(next(c for c in cells if c.rate == r).infeasible_share, 4) for r in rates
        ],
        "goodput_rps": {
            name: [
                round(
                    next(
                        c for c in cells if c.contender == name and c.rate == r
                    ).outcome.goodput_rps,
                    3,
                )
                for r in rates
            ]
            for name in dict.fromkeys(c.contender for c in cells)
        },
        "vs_best_static": ratios,
        "ours_vs_best_static": _worst(ratios, planner_only=False),
        "planner_only_vs_best_static": _worst(ratios, planner_only=True),
    }
