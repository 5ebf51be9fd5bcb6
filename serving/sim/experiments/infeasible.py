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

Example::

    setup, cells = long_prompts(Scenario("azure_code", 4, 60.0), contenders)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from serving.sim.cluster import Workload
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
    "LONG_PROMPT_FACTOR",
    "LONG_PROMPT_RATES",
    "LONG_PROMPT_TRACE",
    "LongPromptCell",
    "LongPromptSetup",
    "long_prompt_contenders",
    "long_prompt_json",
    "long_prompt_table",
    "long_prompt_verdict",
    "long_prompts",
]

LONG_PROMPT_TRACE = "azure_code"
#: Every prompt of the trace this many times longer.
LONG_PROMPT_FACTOR = 4.0
#: The fixed rate scales (× the trace's own rate) the contenders are compared at.
LONG_PROMPT_RATES = (1.0, 2.0, 4.0, 8.0)
#: Lighter rates probed (with ``LONG_PROMPT_RATES[0]``) on every split for a knee.
KNEE_PROBES = (0.5,)


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
) -> tuple[LongPromptSetup, list[LongPromptCell]]:
    """The knee verdict and every contender (and the best static split) at each of
    ``rates`` (see the module docstring)."""
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
        cells.append(LongPromptCell(rate, "best static", static, share, None))
    return setup, cells


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
            extra = f"{out.split[0]}P:{out.split[1]}D, " if name == "best static" else ""
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
    return "\n".join(lines)


def long_prompt_json(setup: LongPromptSetup, cells: Sequence[LongPromptCell]) -> dict[str, object]:
    """The headline figures: the knee (``None``: no knee) and goodput per contender at
    each fixed rate (req/s)."""
    rates = sorted({c.rate for c in cells})
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
    }
