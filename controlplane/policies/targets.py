"""The latency targets an SLO sets for the control loops: one rule, used by admission, the
planner and the simulator's adapters alike.

* **TTFT target** — the tightest TTFT objective.
* **ITL target** — the tightest of the ITL objectives (any statistic: ``max`` or a
  percentile) and the TPOT objective. The loops predict a decode step time, which must stay
  within both: a TPOT objective bounds the mean gap, an ITL one every gap (or a share of
  them), so whichever is lower binds.

An objective the SLO does not set is ``None`` per SLO; across a registry,
:func:`slo_targets` takes the tightest of each and stands in :data:`UNCONSTRAINED_S` for a
metric no SLO sets.

Example::

    objectives = (Objective(Metric.TTFT, 0.5), Objective(Metric.ITL, 0.2),
                  Objective(Metric.TPOT, 0.05))
    assert itl_target_s(objectives) == 0.05
    targets = slo_targets([objectives])  # SLOTargets(ttft_s=0.5, itl_s=0.05)
"""

from __future__ import annotations

from collections.abc import Iterable

from controlplane.policies.planner_model import SLOTargets
from exporters.slo import Metric, Objective

__all__ = ["UNCONSTRAINED_S", "itl_target_s", "slo_targets", "ttft_target_s"]

#: The target of a metric that no SLO constrains: effectively none.
UNCONSTRAINED_S = 3600.0

_DECODE_METRICS = (Metric.ITL, Metric.TPOT)


def ttft_target_s(objectives: Iterable[Objective]) -> float | None:
    """The tightest TTFT threshold of ``objectives`` (``None`` without one)."""
    return min((o.threshold_s for o in objectives if o.metric is Metric.TTFT), default=None)


def itl_target_s(objectives: Iterable[Objective]) -> float | None:
    """The tightest ITL or TPOT threshold of ``objectives`` (``None`` without either)."""
    return min((o.threshold_s for o in objectives if o.metric in _DECODE_METRICS), default=None)


def slo_targets(objective_sets: Iterable[Iterable[Objective]]) -> SLOTargets | None:
    """The tightest TTFT and ITL targets over several SLOs' objectives (one set per SLO);
    ``None`` when none constrains either."""
    ttft: list[float] = []
    itl: list[float] = []
    for objectives in map(tuple, objective_sets):
        for found, into in ((ttft_target_s(objectives), ttft), (itl_target_s(objectives), itl)):
            if found is not None:
                into.append(found)
    if not ttft and not itl:
        return None
    return SLOTargets(
        ttft_s=min(ttft, default=UNCONSTRAINED_S), itl_s=min(itl, default=UNCONSTRAINED_S)
    )
