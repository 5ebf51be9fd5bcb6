"""SLOSpec: the engine's view of one SLO — plain data, built from the registry's rows.

The registry (database) is the one source of truth; the goodput engine receives immutable
specs and never touches the database. Objectives reuse the metric core's types.

Each objective has a *key* that names it in violation counts, rollups and Prometheus labels
(:func:`objective_key`): the metric's name (``"ttft"``, ``"tpot"``, ``"e2el"``, ``"itl"``
for the largest gap), and ``"itl_pNN"`` for a per-request ITL percentile (``"itl_p99"``,
``"itl_p99.9"``). Keys are unique within an SLO.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from exporters.records import LABEL_KEYS, Vantage
from exporters.slo import Metric, Objective

#: An SLO's choices for requests admission predicts can never meet its TTFT objective.
INFEASIBLE_ACTIONS = ("admit", "reject")

__all__ = ["INFEASIBLE_ACTIONS", "SLOSpec", "SpecError", "measurement_warnings", "objective_key"]


class SpecError(ValueError):
    """An SLO spec that cannot be evaluated; the message names the field."""


def objective_key(objective: Objective) -> str:
    """The objective's stable name: ``"ttft"``, ``"tpot"``, ``"e2el"``, ``"itl"``, ``"itl_p99"``."""
    if objective.metric is Metric.ITL and objective.statistic != "max":
        return f"itl_{objective.statistic}"
    return objective.metric.value


def measurement_warnings(vantage: object, objectives: Iterable[Objective]) -> list[str]:
    """What an SLO judged at ``vantage`` cannot measure, one sentence per objective.

    At the engine vantage, vLLM's own records — its stat-logger plugin's and its OTLP
    ``llm_request`` spans — carry the first and last token only (``SUMMARY`` detail): an ITL
    objective is *unmeasured* on them (docs/metrics.md), and requests from those sources
    are judged on the other objectives. Only engine-side producers that send every token
    (an OpenTelemetry exporter with token events) measure it there. The gateway vantage
    measures every objective.

    >>> measurement_warnings("engine", [Objective(Metric.ITL, 0.05, "p99")])[0][:40]
    "objective 'itl_p99' (itl p99 <= 0.05 s) "
    """
    if _vantage(vantage) is not Vantage.ENGINE:
        return []
    return [
        f"objective {objective_key(o)!r} (itl {o.statistic} <= {o.threshold_s:g} s) cannot be "
        "measured on vLLM's engine-side records (stat-logger plugin, OTLP llm_request spans: "
        "first and last token only); those requests are judged on the other objectives and "
        "counted as unmeasured (measured_ratio); judge ITL at vantage 'gateway'"
        for o in objectives
        if o.metric is Metric.ITL
    ]


def _vantage(value: object) -> Vantage:
    """A :class:`Vantage` from itself, its int value or its name (``"gateway"``, ``"engine"``)."""
    if isinstance(value, Vantage):
        return value
    if isinstance(value, str) and value.upper() in Vantage.__members__:
        return Vantage[value.upper()]
    if isinstance(value, int) and not isinstance(value, bool) and value in set(Vantage):
        return Vantage(value)
    raise SpecError(f"vantage must be one of {[v.name.lower() for v in Vantage]}, got {value!r}")


@dataclass(frozen=True, slots=True)
class SLOSpec:
    """One SLO as the engine evaluates it.

    ``selector`` maps label keys (a subset of ``LABEL_KEYS``) to the value a request must
    carry; an empty selector selects every request of the vantage. ``objectives`` are
    :class:`exporters.slo.Objective` values with distinct :func:`objective_key` keys (none
    at all means every successful request is good). ``target`` is the good ratio
    (0 < target < 1), ``window_s`` the compliance window, ``availability_target`` the
    optional objective on admitted / (admitted + rejected). ``vantage`` may be given as a
    :class:`~exporters.records.Vantage`, its value, or its name (``"gateway"``, ``"engine"``).

    Example::

        spec = SLOSpec(
            id="chat", name="chat-premium", target=0.99, window_s=28 * 86400,
            objectives=(Objective(Metric.TTFT, 0.2), Objective(Metric.ITL, 0.05, "p99")),
            selector={"tenant": "acme"},
        )
        assert spec.objective_keys == ("ttft", "itl_p99")
    """

    id: str
    name: str
    objectives: tuple[Objective, ...]
    target: float
    window_s: float
    selector: Mapping[str, str] = field(default_factory=dict)
    vantage: Vantage = Vantage.GATEWAY
    availability_target: float | None = None
    version: int = 1
    #: What admission does with a request predicted to miss the TTFT objective even on an
    #: idle instance: ``"admit"`` (best effort, counted apart) or ``"reject"`` (at once).
    infeasible: str = "admit"

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise SpecError(f"id must be a non-empty string, got {self.id!r}")
        objectives = tuple(self.objectives)
        for k, objective in enumerate(objectives):
            if not isinstance(objective, Objective):
                raise SpecError(f"objectives[{k}] must be an Objective, got {objective!r}")
        object.__setattr__(self, "objectives", objectives)
        keys = [objective_key(o) for o in objectives]
        duplicate = next((key for k, key in enumerate(keys) if key in keys[:k]), None)
        if duplicate is not None:
            raise SpecError(
                f"objectives: two objectives share the key {duplicate!r}; "
                "allowed: one objective per metric and ITL statistic"
            )
        unknown = sorted(set(self.selector) - set(LABEL_KEYS))
        if unknown:
            raise SpecError(f"selector: unknown label {unknown[0]!r}; allowed: {list(LABEL_KEYS)}")
        object.__setattr__(self, "selector", dict(self.selector))
        if not 0.0 < self.target < 1.0:
            raise SpecError(f"target must be in (0, 1), got {self.target}")
        if not (math.isfinite(self.window_s) and self.window_s >= 1.0):
            raise SpecError(
                f"window_s must be a finite number of seconds >= 1, got {self.window_s}"
            )
        if self.availability_target is not None and not 0.0 < self.availability_target < 1.0:
            raise SpecError(
                f"availability_target must be in (0, 1), got {self.availability_target}"
            )
        if self.infeasible not in INFEASIBLE_ACTIONS:
            raise SpecError(
                f"infeasible must be one of {list(INFEASIBLE_ACTIONS)}, got {self.infeasible!r}"
            )
        object.__setattr__(self, "vantage", _vantage(self.vantage))

    @property
    def objective_keys(self) -> tuple[str, ...]:
        """The objectives' keys, in order (see :func:`objective_key`)."""
        return tuple(objective_key(o) for o in self.objectives)
