"""One evaluation run: a (scenario, split, rate, policy) in the simulator, judged per request.

Goodput here is **good requests per second of arrivals**: the requests that arrive in a
window and turn out good, divided by the window's length — so a request that arrives in
the run and finishes late, in the drain after the last arrival, still counts where it
arrived, and a run is never credited for the time it takes to drain a backlog. Attainment
is good / judged (admitted, finished OK or in error); rejected requests are not judged,
and are reported beside goodput (``rejected_ratio``) so that shedding never passes for
service. Every request is judged with ``exporters.slo.judge`` on the run's records (the
goodput engine's own verdicts), then windows are cut by arrival time.

**Token goodput** is counted the same way, in tokens: the prompt and output tokens of the
good requests arriving in the window, divided by the window. A policy that sheds the most
expensive requests gains request goodput cheaply; token goodput does not reward that.
:meth:`RunOutcome.class_counts` gives offered and rejected per prompt-length class.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from exporters.fleet import PoolRole
from exporters.records import RecordBatch, Status
from exporters.slo import judge
from serving.sim.cluster import NoControl, SimPolicy, Simulator, Workload, build_workload
from serving.sim.experiments.observe import RoleChange, RoleChangeObserver
from serving.sim.experiments.scenario import Scenario, cached_trace

__all__ = ["ClassCounts", "RunOutcome", "WindowStats", "run_policy", "scenario_workload"]

F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Requests arriving in ``[start_s, end_s)``: offered, judged, good, rejected."""

    start_s: float
    end_s: float
    offered: int
    judged: int
    good: int
    rejected: int
    good_tokens: int = 0  # prompt + output tokens of the good requests

    @property
    def goodput_rps(self) -> float:
        span = self.end_s - self.start_s
        return self.good / span if span > 0 else 0.0

    @property
    def token_goodput_tps(self) -> float:
        """Good prompt + output tokens per second of arrivals."""
        span = self.end_s - self.start_s
        return self.good_tokens / span if span > 0 else 0.0

    @property
    def attainment_ratio(self) -> float:
        """good / judged; 1.0 when nothing was judged (nothing was served badly)."""
        return self.good / self.judged if self.judged else 1.0


@dataclass(frozen=True, slots=True)
class ClassCounts:
    """One prompt-length class of a run: prompts in ``(low, high]`` tokens, the requests
    offered, rejected, and all the run's rejections (for the class's share of them)."""

    low: int
    high: int | None  # None: no upper bound
    offered: int
    rejected: int
    all_rejected: int

    @property
    def availability_ratio(self) -> float:
        """Admitted ÷ offered (1 when nothing was offered)."""
        return 1.0 - self.rejected / self.offered if self.offered else 1.0

    @property
    def rejected_share(self) -> float:
        """This class's share of the run's rejections (0 when none)."""
        return self.rejected / self.all_rejected if self.all_rejected else 0.0


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What one run gave: the whole run's window stats, role changes, and per-request
    columns (arrival, good, judged, rejected) for other windows."""

    policy: str
    split: tuple[int, int]
    rate_scale: float
    duration_s: float
    total: WindowStats
    role_changes: tuple[RoleChange, ...]
    moved_jobs: int
    dropped_jobs: int
    end_s: float
    wall_s: float
    arrival_s: F64
    good: B
    judged: B
    rejected: B
    tokens: I64  # prompt + output tokens per request (output: as emitted)
    prompt_tokens: I64
    offered_tokens: int = 0  # prompt + output tokens of every request the workload offered

    @property
    def offered_tokens_tps(self) -> float:
        """The token goodput if every request offered were good (the ceiling)."""
        return self.offered_tokens / self.duration_s

    @property
    def goodput_rps(self) -> float:
        return self.total.goodput_rps

    @property
    def token_goodput_tps(self) -> float:
        return self.total.token_goodput_tps

    def class_counts(self, bounds: tuple[int, ...]) -> list[ClassCounts]:
        """Offered and rejected per prompt-length class (class ``i``: prompts in
        ``(bounds[i-1], bounds[i]]``), for the requests arriving in the run."""
        rows = (self.arrival_s >= 0.0) & (self.arrival_s < self.duration_s)
        cls = np.searchsorted(np.asarray(bounds, dtype=np.int64), self.prompt_tokens, "left")
        all_rejected = int((rows & self.rejected).sum())
        edges = (0, *bounds)
        out = []
        for i, low in enumerate(edges):
            mine = rows & (cls == i)
            out.append(
                ClassCounts(
                    low=low,
                    high=bounds[i] if i < len(bounds) else None,
                    offered=int(mine.sum()),
                    rejected=int((mine & self.rejected).sum()),
                    all_rejected=all_rejected,
                )
            )
        return out

    @property
    def attainment_ratio(self) -> float:
        return self.total.attainment_ratio

    @property
    def rejected_ratio(self) -> float:
        return self.total.rejected / self.total.offered if self.total.offered else 0.0

    @property
    def role_changes_per_h(self) -> float:
        """Role changes per hour of the run (arrivals and drain: the planner ran
        throughout)."""
        return len(self.role_changes) * 3600.0 / max(self.end_s, self.duration_s)

    @property
    def final_split(self) -> tuple[int, int]:
        """The P:D split after the run's role changes."""
        prefill = self.split[0]
        for change in self.role_changes:
            prefill += (change.new is PoolRole.PREFILL) - (change.old is PoolRole.PREFILL)
        return prefill, self.split[0] + self.split[1] - prefill

    def window(self, start_s: float, end_s: float) -> WindowStats:
        """Stats of the requests arriving in ``[start_s, end_s)``."""
        rows = (self.arrival_s >= start_s) & (self.arrival_s < end_s)
        return WindowStats(
            start_s=start_s,
            end_s=end_s,
            offered=int(rows.sum()),
            judged=int((rows & self.judged).sum()),
            good=int((rows & self.good).sum()),
            rejected=int((rows & self.rejected).sum()),
            good_tokens=int(self.tokens[rows & self.good].sum()),
        )

    def row(self) -> dict[str, object]:
        """A JSON-ready summary (no per-request columns)."""
        return {
            "policy": self.policy,
            "split": f"{self.split[0]}P:{self.split[1]}D",
            "rate_scale": round(self.rate_scale, 4),
            "goodput_rps": round(self.goodput_rps, 4),
            "attainment_ratio": round(self.attainment_ratio, 4),
            "rejected_ratio": round(self.rejected_ratio, 4),
            "token_goodput_tps": round(self.token_goodput_tps, 1),
            "role_changes": len(self.role_changes),
            "final_split": f"{self.final_split[0]}P:{self.final_split[1]}D",
            "dropped_jobs": self.dropped_jobs,
        }


def scenario_workload(
    scenario: Scenario,
    rate_scale: float,
    transform: Callable[[Workload], Workload] | None = None,
) -> Workload:
    """The scenario's trace at ``rate_scale`` for its duration, optionally transformed."""
    work = build_workload(
        cached_trace(scenario.trace), rate_scale=rate_scale, duration_s=scenario.duration_s
    )
    return transform(work) if transform is not None else work


def _verdict_columns(batch: RecordBatch, scenario: Scenario, epoch_s: float) -> tuple[F64, B, B, B]:
    verdicts = judge(batch, list(scenario.objectives))
    arrival = batch.arrival_time_ns.astype(np.float64) / 1e9 - epoch_s
    rejected = batch.status == Status.REJECTED
    return arrival, verdicts.good, verdicts.judged, rejected


def run_policy(
    scenario: Scenario,
    split: tuple[int, int],
    rate_scale: float,
    policy: SimPolicy | None = None,
    *,
    name: str = "",
    transform: Callable[[Workload], Workload] | None = None,
) -> RunOutcome:
    """Simulate ``policy`` (``None``: no control) on ``split`` at ``rate_scale`` and judge
    every request (see the module docstring)."""
    wall0 = time.perf_counter()
    work = scenario_workload(scenario, rate_scale, transform)
    observer: RoleChangeObserver | None = None
    sim_policy: SimPolicy = NoControl()
    sample = None
    if policy is not None and not isinstance(policy, NoControl):
        observer = RoleChangeObserver(policy)
        sim_policy = observer
        # The simulator plans on its sampling tick: make the tick no coarser than the policy.
        sample = min(float(policy.interval_s), scenario.duration_s / 500.0)
    options = scenario.options(sample_interval_s=sample)
    sim = Simulator(scenario.spec(split), work, options, sim_policy)
    if observer is not None:
        observer.bind(sim.instances)
    result = sim.run()
    batch = RecordBatch.concat(result.records or [])
    arrival, good, judged, rejected = _verdict_columns(batch, scenario, options.epoch_s)
    offered = work.arrival_s < scenario.duration_s
    offered_tokens = int(work.prompt_tokens[offered].sum() + work.output_tokens[offered].sum())
    prompt_tokens = batch.prompt_tokens.astype(np.int64)
    tokens = prompt_tokens + batch.output_tokens()
    outcome = RunOutcome(
        policy=name or ("none" if policy is None else type(policy).__name__),
        split=split,
        rate_scale=rate_scale,
        duration_s=scenario.duration_s,
        total=WindowStats(
            start_s=0.0,
            end_s=scenario.duration_s,
            offered=len(batch),
            judged=int(judged.sum()),
            good=int(good.sum()),
            rejected=int(rejected.sum()),
            good_tokens=int(tokens[good].sum()),
        ),
        role_changes=tuple(observer.changes) if observer else (),
        moved_jobs=len(observer.held) if observer else 0,
        dropped_jobs=len(observer.dropped_jobs()) if observer else 0,
        end_s=result.end_s,
        wall_s=time.perf_counter() - wall0,
        arrival_s=arrival,
        good=good,
        judged=judged,
        rejected=rejected,
        tokens=tokens,
        prompt_tokens=prompt_tokens,
        offered_tokens=offered_tokens,
    )
    return outcome
