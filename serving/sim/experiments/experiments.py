"""The three experiments of issue 6: overload, a workload shift, stability.

* :func:`capacity` — the cluster's knee without control: for every static split, the
  highest rate scale whose attainment meets the target (a :func:`find_knee` bisection;
  a split is skipped after one run when it misses the target just above the best knee so
  far), the best split, and the **peak goodput**: the most goodput any of those runs
  reached (and the **peak token goodput**, good tokens per second, found the same way).
* :func:`overload` — every contender at ``levels`` × the knee, started from the best
  split, and the best static split at each level (a sweep: the max goodput over splits).
* :func:`workload_shift` — prompts ×``factor`` from half-way through the run; each
  contender's goodput per phase against the best static split *of that phase* (the max
  over splits of that phase's goodput), and how long attainment takes to recover.
* :func:`stability` — a contender under stationary load: role changes per hour, the
  requests its moved instances held, and how many of them did not finish.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from serving.sim.cluster import Workload
from serving.sim.control.baselines import static_splits
from serving.sim.experiments.contenders import Contender
from serving.sim.experiments.knee import Knee, find_knee
from serving.sim.experiments.run import RunOutcome, run_policy
from serving.sim.experiments.scenario import Scenario
from serving.sim.experiments.shift import recovery_s, shift_inputs

__all__ = [
    "Capacity",
    "OverloadCell",
    "ShiftOutcome",
    "ShiftSetup",
    "StabilityOutcome",
    "best_static",
    "capacity",
    "overload",
    "stability",
    "workload_shift",
]

Transform = Callable[[Workload], Workload]


@dataclass(slots=True)
class Capacity:
    """The knee over static splits (module docstring). ``knees``: each split's knee
    (``0.0`` for a split skipped after one run). ``peak``: the run with the most goodput
    among all the search's runs (every split, every rate probed) and one at 1.2× the knee
    on the best split — goodput can keep rising past the knee while attainment falls."""

    split: tuple[int, int]
    knee: Knee
    peak: RunOutcome
    knees: dict[tuple[int, int], float] = field(default_factory=dict)
    num_runs: int = 0
    peak_tokens: RunOutcome | None = None  # the run with the most token goodput

    @property
    def peak_token_goodput_tps(self) -> float:
        top = self.peak_tokens or self.peak
        return top.token_goodput_tps

    @property
    def rate(self) -> float:
        return self.knee.rate

    @property
    def peak_goodput_rps(self) -> float:
        return self.peak.goodput_rps


def _split_order(splits: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Middle splits first: they usually hold the best knee, so the others are pruned."""
    mid = (len(splits) - 1) / 2.0
    return sorted(splits, key=lambda s: abs(splits.index(s) - mid))


def capacity(
    scenario: Scenario,
    splits: Sequence[tuple[int, int]] | None = None,
    *,
    start: float = 1.0,
    rel_tol: float = 0.05,
    transform: Transform | None = None,
) -> Capacity:
    """The knee of ``scenario`` without control over ``splits`` (default: all)."""
    splits = list(splits or static_splits(scenario.num_instances))
    runs: dict[tuple[tuple[int, int], float], RunOutcome] = {}

    def attainment(split: tuple[int, int]) -> Callable[[float], float]:
        def measure(rate: float) -> float:
            out = run_policy(scenario, split, rate, None, name="no control", transform=transform)
            runs[(split, rate)] = out
            return out.attainment_ratio

        return measure

    best: tuple[tuple[int, int], Knee] | None = None
    knees: dict[tuple[int, int], float] = {}
    for split in _split_order(splits):
        measure = attainment(split)
        if best is not None:
            probe = best[1].rate * (1.0 + rel_tol)
            if measure(probe) < scenario.target:
                knees[split] = 0.0
                continue
            knee = find_knee(measure, scenario.target, start=probe, rel_tol=rel_tol)
        else:
            knee = find_knee(measure, scenario.target, start=start, rel_tol=rel_tol)
        knees[split] = knee.rate
        if best is None or knee.rate > best[1].rate:
            best = (split, knee)
    assert best is not None  # splits is never empty (static_splits raises first)
    split, knee = best
    if knee.rate <= 0:
        raise ValueError(
            f"{scenario.trace}: no split meets attainment {scenario.target} at any rate "
            f"down to {knee.first_miss:g}x; loosen the SLO"
        )
    attainment(split)(1.2 * knee.rate)
    peak = max(runs.values(), key=lambda r: r.goodput_rps)
    peak_tokens = max(runs.values(), key=lambda r: r.token_goodput_tps)
    return Capacity(split, knee, peak, knees, len(runs), peak_tokens)


@dataclass(frozen=True, slots=True)
class OverloadCell:
    """One contender at one overload level (``best static``: the sweep's best split)."""

    trace: str
    level: float
    contender: str
    outcome: RunOutcome
    peak_goodput_rps: float
    peak_token_goodput_tps: float = 0.0

    @property
    def goodput_ratio(self) -> float:
        """Goodput over the peak goodput (the goal: >= 0.9)."""
        return self.outcome.goodput_rps / self.peak_goodput_rps if self.peak_goodput_rps else 0.0

    @property
    def token_goodput_ratio(self) -> float:
        """Token goodput over the peak token goodput."""
        peak = self.peak_token_goodput_tps
        return self.outcome.token_goodput_tps / peak if peak else 0.0

    @property
    def token_goodput_vs_ceiling(self) -> float:
        """Token goodput over the lower of the peak token goodput and the offered token
        load (no policy can serve more good tokens than it was offered)."""
        offered = self.outcome.offered_tokens_tps
        ceiling = min(self.peak_token_goodput_tps, offered) if offered else 0.0
        return self.outcome.token_goodput_tps / ceiling if ceiling else 0.0


def best_static(
    scenario: Scenario,
    rate: float,
    splits: Sequence[tuple[int, int]],
    *,
    transform: Transform | None = None,
) -> list[RunOutcome]:
    """No control on every split at ``rate``, best goodput first."""
    runs = [
        run_policy(scenario, split, rate, None, name="static", transform=transform)
        for split in splits
    ]
    return sorted(runs, key=lambda r: -r.goodput_rps)


def overload(
    scenario: Scenario,
    cap: Capacity,
    contenders: Sequence[Contender],
    *,
    levels: Sequence[float] = (1.5, 2.0, 3.0),
    splits: Sequence[tuple[int, int]] | None = None,
) -> tuple[float, list[OverloadCell]]:
    """Every contender and the best static split at each level × the knee; returns the
    peak goodput (the capacity search's, or a static sweep's if higher) and the cells
    (each also holds the peak token goodput, found the same way)."""
    splits = list(splits or static_splits(scenario.num_instances))
    runs: list[tuple[float, str, RunOutcome]] = []
    peak = cap.peak_goodput_rps
    peak_tokens = cap.peak_token_goodput_tps
    for level in levels:
        rate = level * cap.rate
        for contender in contenders:
            policy = contender.make(scenario, cap.split)
            out = run_policy(scenario, cap.split, rate, policy, name=contender.name)
            runs.append((level, contender.name, out))
        sweep = best_static(scenario, rate, splits)
        static = sweep[0]
        peak = max(peak, static.goodput_rps)
        peak_tokens = max(peak_tokens, *(r.token_goodput_tps for r in sweep))
        runs.append((level, "best static", static))
    cells = [
        OverloadCell(scenario.trace, lvl, name, out, peak, peak_tokens) for lvl, name, out in runs
    ]
    return peak, cells


@dataclass(frozen=True, slots=True)
class ShiftOutcome:
    """A contender's run through the shift: goodput per phase, each against the best
    static split of that phase, and its recovery time."""

    contender: str
    outcome: RunOutcome
    phase_goodput_rps: tuple[float, float]
    best_static_rps: tuple[float, float]
    best_static_splits: tuple[tuple[int, int], tuple[int, int]]
    recovery_s: float

    @property
    def phase_ratios(self) -> tuple[float, float]:
        return (
            _ratio(self.phase_goodput_rps[0], self.best_static_rps[0]),
            _ratio(self.phase_goodput_rps[1], self.best_static_rps[1]),
        )


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference > 0 else (1.0 if value <= 0 else math.inf)


@dataclass(slots=True)
class ShiftSetup:
    """How the shift run was set up: the rate, the initial split, both phases' knees."""

    rate: float
    split: tuple[int, int]
    short: Capacity
    long: Capacity
    factor: float
    shift_s: float
    load: float
    static_runs: list[RunOutcome] = field(default_factory=list)


def workload_shift(
    scenario: Scenario,
    contenders: Sequence[Contender],
    *,
    factor: float = 4.0,
    load: float = 0.8,
    splits: Sequence[tuple[int, int]] | None = None,
    short: Capacity | None = None,
    long: Capacity | None = None,
    bucket_s: float = 10.0,
) -> tuple[ShiftSetup, list[ShiftOutcome]]:
    """Short prompts, then ``factor``-times longer ones from half-way (see the module
    docstring). The rate is ``load`` × the knee of the long-prompt workload (so the best
    static split can serve the second phase); every contender starts from the split that
    serves the short prompts best. ``short`` / ``long``: the two knees when already known
    (another load of the same scenario)."""
    splits = list(splits or static_splits(scenario.num_instances))
    shift_at = scenario.duration_s / 2.0
    max_context = scenario.max_context_tokens()
    short = short or capacity(scenario, splits)
    long_cap = long or capacity(
        scenario,
        splits,
        start=max(short.rate / factor, 1e-3),
        transform=lambda w: shift_inputs(w, 0.0, factor, max_context_tokens=max_context),
    )
    rate = load * long_cap.rate

    def transform(w: Workload) -> Workload:
        return shift_inputs(w, shift_at, factor, max_context_tokens=max_context)

    setup = ShiftSetup(rate, short.split, short, long_cap, factor, shift_at, load)
    setup.static_runs = best_static(scenario, rate, splits, transform=transform)
    phases = ((0.0, shift_at), (shift_at, scenario.duration_s))
    best_rps: list[float] = []
    best_splits: list[tuple[int, int]] = []
    for lo, hi in phases:
        top = max(setup.static_runs, key=lambda r: r.window(lo, hi).goodput_rps)
        best_rps.append(top.window(lo, hi).goodput_rps)
        best_splits.append(top.split)
    outcomes: list[ShiftOutcome] = []
    runs = [
        (
            c.name,
            run_policy(
                scenario,
                short.split,
                rate,
                c.make(scenario, short.split),
                name=c.name,
                transform=transform,
            ),
        )
        for c in contenders
    ]
    static_whole = setup.static_runs[0]
    runs.append((f"static {static_whole.split[0]}P:{static_whole.split[1]}D", static_whole))
    for name, out in runs:
        outcomes.append(
            ShiftOutcome(
                contender=name,
                outcome=out,
                phase_goodput_rps=(
                    out.window(*phases[0]).goodput_rps,
                    out.window(*phases[1]).goodput_rps,
                ),
                best_static_rps=(best_rps[0], best_rps[1]),
                best_static_splits=(best_splits[0], best_splits[1]),
                recovery_s=recovery_s(
                    out.arrival_s,
                    out.good,
                    out.judged,
                    shift_s=shift_at,
                    end_s=scenario.duration_s,
                    target=scenario.target,
                    bucket_s=bucket_s,
                ),
            )
        )
    return setup, outcomes


@dataclass(frozen=True, slots=True)
class StabilityOutcome:
    """A contender under stationary load (``load`` × the knee)."""

    trace: str
    contender: str
    load: float
    outcome: RunOutcome

    @property
    def role_changes_per_h(self) -> float:
        return self.outcome.role_changes_per_h


def stability(
    scenario: Scenario, cap: Capacity, contender: Contender, *, load: float = 0.8
) -> StabilityOutcome:
    """``contender`` at ``load`` × the knee from the best split."""
    policy = contender.make(scenario, cap.split)
    out = run_policy(scenario, cap.split, load * cap.rate, policy, name=contender.name)
    return StabilityOutcome(scenario.trace, contender.name, load, out)
