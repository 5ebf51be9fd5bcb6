"""Evaluation of the control loops in the cluster simulator (issue 6).

* :class:`Scenario` — a trace on N PD instances, its SLO, a duration, a seed;
* :func:`run_policy` / :class:`RunOutcome` — one run judged per request, by arrival;
* :func:`find_knee` — the rate at which attainment first drops below the target;
* :func:`shift_inputs`, :func:`recovery_s` — the workload shift and its recovery time;
* :class:`RoleChangeObserver` — role changes and the requests they could have dropped;
* :class:`Contender`, :class:`Combined`, :func:`baseline_contenders`,
  :func:`control_contenders` — the policies compared;
* :func:`capacity`, :func:`overload`, :func:`workload_shift`, :func:`stability` — the
  experiments; ``report`` and ``plots`` render them;
* :func:`long_prompts` — a long-prompt workload with no knee, compared at fixed rates
  (``infeasible``).

See docs/experiments/control.md; ``benchmarks/control_eval.py`` runs it all.
"""

from serving.sim.experiments.contenders import Combined, Contender, baseline_contenders
from serving.sim.experiments.experiments import (
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
from serving.sim.experiments.infeasible import long_prompts
from serving.sim.experiments.knee import Knee, find_knee
from serving.sim.experiments.observe import RoleChange, RoleChangeObserver
from serving.sim.experiments.ours import OURS, control_contenders
from serving.sim.experiments.run import RunOutcome, WindowStats, run_policy
from serving.sim.experiments.scenario import TRACE_SLOS, Scenario
from serving.sim.experiments.shift import recovery_s, shift_inputs

__all__ = [
    "OURS",
    "TRACE_SLOS",
    "Capacity",
    "Combined",
    "Contender",
    "Knee",
    "OverloadCell",
    "RoleChange",
    "RoleChangeObserver",
    "RunOutcome",
    "Scenario",
    "ShiftOutcome",
    "ShiftSetup",
    "StabilityOutcome",
    "WindowStats",
    "baseline_contenders",
    "capacity",
    "control_contenders",
    "find_knee",
    "long_prompts",
    "overload",
    "recovery_s",
    "run_policy",
    "shift_inputs",
    "stability",
    "workload_shift",
]
