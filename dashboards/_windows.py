"""Alert windows and burn-rate factors (SRE workbook, multi-window multi-burn-rate).

Each alert pairs a long and a short window and fires when the error ratio over both exceeds
``factor × (1 − target)``. The factor is the share of the whole error budget that the long
window may consume, scaled to the SLO's compliance window ``W``: ``factor = budget_share ×
W / long``. For ``W = 30d`` that gives the workbook's 14.4, 6, 3 and 1 (Sloth's rule); for
``W = 28d`` 13.44, 5.6, 2.8 and 0.933.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

__all__ = ["ALERT_WINDOWS", "SLI_WINDOWS", "AlertWindow", "duration", "seconds"]

_UNITS = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))

#: The windows every SLO records its SLI error ratio over (Sloth's set).
SLI_WINDOWS: tuple[str, ...] = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")


@functools.lru_cache(maxsize=64)
def seconds(text: str) -> int:
    """``"6h"`` → 21600 (one unit of :data:`_UNITS`)."""
    return int(text[:-1]) * dict(_UNITS)[text[-1]]


def duration(window_s: int) -> str:
    """The shortest Prometheus duration for ``window_s``: 2419200 → ``"28d"``, 90 → ``"90s"``."""
    for unit, size in _UNITS:
        if window_s % size == 0:
            return f"{window_s // size}{unit}"
    raise AssertionError("unreachable: every integer is a whole number of seconds")


@dataclass(frozen=True, slots=True)
class AlertWindow:
    """One alert: ``budget_share`` of the budget spent within ``long`` (confirmed by ``short``)."""

    severity: str
    long: str
    short: str
    budget_share: float

    @property
    def budget_text(self) -> str:
        """The budget share as alert summaries write it: 0.02 → ``"2%"``."""
        return f"{self.budget_share * 100:g}%"

    def factor(self, window_s: int) -> float:
        """The burn-rate threshold for a compliance window of ``window_s`` seconds."""
        return self.budget_share * window_s / seconds(self.long)


#: Page: 2 % of the budget in 1 h, 5 % in 6 h; ticket: 10 % in 1 d, 10 % in 3 d.
ALERT_WINDOWS: tuple[AlertWindow, ...] = (
    AlertWindow("page", "1h", "5m", 0.02),
    AlertWindow("page", "6h", "30m", 0.05),
    AlertWindow("ticket", "1d", "2h", 0.10),
    AlertWindow("ticket", "3d", "6h", 0.10),
)
