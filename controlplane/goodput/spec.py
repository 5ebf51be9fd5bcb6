"""SLOSpec: the engine's view of one SLO — plain data, built from the registry's rows.

The registry (database) is the one source of truth; the goodput engine receives immutable
specs and never touches the database. Objectives reuse the metric core's types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from exporters.records import LABEL_KEYS, Vantage

__all__ = ["SLOSpec", "SpecError"]


class SpecError(ValueError):
    """An SLO spec that cannot be evaluated; the message names the field."""


@dataclass(frozen=True, slots=True)
class SLOSpec:
    """One SLO as the engine evaluates it.

    ``selector`` maps label keys (a subset of ``LABEL_KEYS``) to the value a request must
    carry; an empty selector selects every request of the vantage. ``objectives`` are
    ``exporters.slo.Objective`` values. ``target`` is the good ratio (0 < target < 1),
    ``window_s`` the compliance window, ``availability_target`` the optional objective on
    admitted / (admitted + rejected).
    """

    id: str
    name: str
    objectives: tuple[object, ...]  # tuple[exporters.slo.Objective, ...]
    target: float
    window_s: float
    selector: Mapping[str, str] = field(default_factory=dict)
    vantage: Vantage = Vantage.GATEWAY
    availability_target: float | None = None
    version: int = 1

    def __post_init__(self) -> None:
        unknown = sorted(set(self.selector) - set(LABEL_KEYS))
        if unknown:
            raise SpecError(f"selector: unknown label {unknown[0]!r}; allowed: {list(LABEL_KEYS)}")
        if not 0.0 < self.target < 1.0:
            raise SpecError(f"target must be in (0, 1), got {self.target}")
        if not self.window_s > 0:
            raise SpecError(f"window_s must be > 0, got {self.window_s}")
        if self.availability_target is not None and not 0.0 < self.availability_target < 1.0:
            raise SpecError(
                f"availability_target must be in (0, 1), got {self.availability_target}"
            )
