"""What the control loops do, on the control plane's ``/metrics``.

* ``goodput_commands_total{kind, state}``: commands that entered each state, per kind
  (:data:`controlplane.services.commands.COMMAND_COUNTS`, counted when their transaction
  commits): ``pending`` (issued, by an operator or a loop), ``delivered`` (every delivery,
  re-deliveries too), ``acked``, ``failed``, ``expired`` (found expired at the target's next
  poll). Every kind and state is exported from the start, at 0.
* ``goodput_planner_moves_total{to_role}``: role moves the PD planner started, by the pool
  the instance moves to (``prefill``, ``decode``, ``both``; operators' moves are not
  counted), from 0.
* ``goodput_planner_predicted_goodput_rps{split}``: the planner's last tick's prediction of
  goodput (requests/s meeting the SLO targets it plans for) for the ``current`` split, the
  ``target`` split it moves toward this tick (the current one when it does not move) and the
  ``best`` split it found. Absent until the planner's first tick with an SLO that constrains
  TTFT or ITL. The observed goodput to compare with is Prometheus's own rate of
  ``goodput_requests_total{result="good"}``.
* ``goodput_planner_move_predicted_goodput_rps{to_role}`` and
  ``goodput_planner_move_observed_goodput_rps{to_role}``: the effect of the last planner move
  to each pool whose observed effect was recorded (``planner_observe_after_s`` after it was
  done): the goodput its plan predicted after the move (``predicted_effect.after``) and the
  goodput observed then (the busiest SLO's over the last minute, ``observed_effect``), the
  figures ``GET /api/v1/automation/moves/{id}`` gives. Set when the record commits, so each
  value changes with a move's recorded effect and stays until the next one to that pool: at
  most three series each (``prefill``, ``decode``, ``both``), absent until the first effect
  recorded by this process (the predicted one also for a move whose plan predicted nothing).

:func:`command_collector` is registered on every app registry
(:func:`controlplane.runtime.live.app_registry`); :class:`PlannerCollector` by the planner's
lifespan while the planner runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane.models import CommandState, PoolRole
from controlplane.policies.planner import Plan
from controlplane.services.commands import COMMAND_COUNTS, CommandCounts
from exporters.commands import CommandKind

__all__ = [
    "CommandCollector",
    "MoveEffect",
    "PlannerCollector",
    "PlannerState",
    "command_collector",
]

SPLITS = ("current", "target", "best")


class CommandCollector(Collector):
    """``goodput_commands_total{kind, state}`` from ``counts``."""

    def __init__(self, counts: CommandCounts = COMMAND_COUNTS) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = self.counts.snapshot()
        family = CounterMetricFamily(
            "goodput_commands",
            "Commands that entered each state (pending = issued), per kind.",
            labels=("kind", "state"),
        )
        kinds = [k.value for k in CommandKind]
        kinds += sorted({k for k, _ in counts} - set(kinds))  # a kind stored by a newer version
        for kind in kinds:
            for state in CommandState:
                family.add_metric([kind, state.value], counts.get((kind, state.value), 0))
        yield family


def command_collector() -> CommandCollector:
    return CommandCollector()


@dataclass(frozen=True)
class MoveEffect:
    """One planner move's goodput (requests/s): predicted by its plan, and observed once
    ``planner_observe_after_s`` had passed (``None``: the move carries no prediction)."""

    predicted_goodput_rps: float | None
    observed_goodput_rps: float

    @classmethod
    def of(cls, observed: Mapping[str, Any]) -> MoveEffect:
        """From a move's recorded ``observed_effect`` (its ``*_goodput_rps`` fields)."""
        predicted = observed.get("predicted_goodput_rps")
        return cls(
            None if predicted is None else float(predicted),
            float(observed["observed_goodput_rps"]),
        )


class PlannerState(Protocol):
    """What :class:`PlannerCollector` reads of a
    :class:`~controlplane.runtime.planner.PlannerRuntime`."""

    @property
    def moves_started(self) -> Mapping[str, int]: ...

    @property
    def last_plan(self) -> Plan | None: ...

    @property
    def move_effects(self) -> Mapping[str, MoveEffect]: ...


class PlannerCollector(Collector):
    """``goodput_planner_*`` of one running planner."""

    def __init__(self, planner: PlannerState) -> None:
        self.planner = planner

    def collect(self) -> Iterator[Metric]:
        planner = self.planner
        moves = CounterMetricFamily(
            "goodput_planner_moves",
            "Role moves the PD planner started, by the pool the instance moves to.",
            labels=("to_role",),
        )
        started = dict(planner.moves_started)
        for role in PoolRole:
            moves.add_metric([role.value], started.get(role.value, 0))
        yield moves
        predicted = GaugeMetricFamily(
            "goodput_planner_predicted_goodput_rps",
            "The planner's last predicted goodput (requests/s) for the current split, the "
            "split it moves toward, and the best split.",
            labels=("split",),
        )
        plan = planner.last_plan
        if plan is not None:
            for split in SPLITS:
                predicted.add_metric([split], getattr(plan, split).goodput_rps)
        yield predicted
        move_predicted = GaugeMetricFamily(
            "goodput_planner_move_predicted_goodput_rps",
            "Goodput (requests/s) the last planner move to each pool whose effect was "
            "recorded was predicted to reach.",
            labels=("to_role",),
        )
        move_observed = GaugeMetricFamily(
            "goodput_planner_move_observed_goodput_rps",
            "Goodput (requests/s) observed after the last planner move to each pool whose "
            "effect was recorded (the busiest SLO, last minute).",
            labels=("to_role",),
        )
        effects = dict(planner.move_effects)
        for role in PoolRole:
            effect = effects.get(role.value)
            if effect is None:
                continue
            if effect.predicted_goodput_rps is not None:
                move_predicted.add_metric([role.value], effect.predicted_goodput_rps)
            move_observed.add_metric([role.value], effect.observed_goodput_rps)
        yield move_predicted
        yield move_observed
