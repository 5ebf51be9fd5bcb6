"""The knee: the rate at which attainment first drops below the SLO's target.

:func:`find_knee` is a pure search over a function of the rate scale that is taken to be
non-increasing (attainment as load grows): it brackets the crossing by doubling (or
halving) from ``start``, then bisects — geometrically, since rates span orders of
magnitude — until the bracket is within ``rel_tol``. The knee is the bracket's low end,
the highest rate probed that still met the target; ``first_miss`` is the lowest that did
not. Every probe is kept so a caller can reuse them (the simulator runs are the cost).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Knee", "find_knee"]


@dataclass(frozen=True, slots=True)
class Knee:
    """``rate``: highest probed rate meeting the target (0.0 if none did down to
    ``min_rate``); ``first_miss``: lowest probed rate missing it (``inf`` if none up to
    ``max_rate``); ``probes``: ``(rate, value)`` in probe order."""

    rate: float
    first_miss: float
    probes: tuple[tuple[float, float], ...]

    @property
    def bracketed(self) -> bool:
        return self.rate > 0 and math.isfinite(self.first_miss)


def find_knee(
    measure: Callable[[float], float],
    target: float,
    *,
    start: float = 1.0,
    rel_tol: float = 0.05,
    min_rate: float = 1e-3,
    max_rate: float = 1e4,
    max_probes: int = 40,
) -> Knee:
    """Search the crossing of ``measure(rate) >= target`` (see the module docstring)."""
    if not (start > 0 and math.isfinite(start)):
        raise ValueError(f"start: must be a finite number > 0, got {start!r}")
    if not (0 < rel_tol < 1):
        raise ValueError(f"rel_tol: must be in (0, 1), got {rel_tol!r}")
    if not (0 < min_rate <= start <= max_rate):
        raise ValueError(
            f"start: must be in [min_rate, max_rate] = [{min_rate}, {max_rate}], got {start}"
        )
    probes: list[tuple[float, float]] = []

    def meets(rate: float) -> bool:
        value = float(measure(rate))
        probes.append((rate, value))
        return value >= target

    lo, hi = 0.0, math.inf
    rate = start
    if meets(rate):
        lo = rate
        while len(probes) < max_probes and rate < max_rate:
            rate = min(rate * 2.0, max_rate)
            if meets(rate):
                lo = rate
            else:
                hi = rate
                break
    else:
        hi = rate
        while len(probes) < max_probes and rate > min_rate:
            rate = max(rate / 2.0, min_rate)
            if meets(rate):
                lo = rate
                break
            hi = rate
    while lo > 0 and math.isfinite(hi) and hi / lo > 1 + rel_tol and len(probes) < max_probes:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return Knee(rate=lo, first_miss=hi, probes=tuple(probes))
