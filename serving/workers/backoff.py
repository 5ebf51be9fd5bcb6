"""Exponential backoff for restarts and retries: pure, clock passed in.

:class:`RestartBackoff` answers "how long to wait before the next attempt": ``initial_s``
after the first failure, then ``multiplier`` times longer after each failure in a row, capped
at ``max_s``. A success that lasts ``reset_after_s`` (a server that stayed healthy, a control
plane that answered) starts the sequence over, so a server that crashes once a day restarts
at once while one that crashes on start is not restarted in a tight loop.

Example::

    backoff = RestartBackoff(initial_s=1.0, max_s=60.0)
    backoff.failure()            # 1.0
    backoff.failure()            # 2.0
    backoff.success(healthy_for_s=120.0)
    backoff.failure()            # 1.0 again
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["RestartBackoff"]


@dataclass(slots=True)
class RestartBackoff:
    """Delays ``initial_s × multiplier**k`` (capped at ``max_s``) for the k-th failure in a
    row; ``num_failures`` counts every failure ever."""

    initial_s: float = 1.0
    max_s: float = 60.0
    multiplier: float = 2.0
    reset_after_s: float = 60.0
    num_failures: int = field(default=0, init=False)
    _streak: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not self.initial_s > 0:
            raise ValueError(f"initial_s must be > 0, got {self.initial_s}")
        if not self.max_s >= self.initial_s:
            raise ValueError(f"max_s must be >= initial_s ({self.initial_s}), got {self.max_s}")
        if not self.multiplier >= 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")
        if not self.reset_after_s >= 0:
            raise ValueError(f"reset_after_s must be >= 0, got {self.reset_after_s}")

    @property
    def streak(self) -> int:
        """Failures since the last lasting success."""
        return self._streak

    def peek(self) -> float:
        """The delay the next failure would get."""
        if self.multiplier == 1:
            return self.initial_s
        # Compare in logs first: the delay is capped anyway, and a huge power overflows.
        if self._streak * math.log(self.multiplier) >= math.log(self.max_s / self.initial_s):
            return self.max_s
        return min(self.max_s, self.initial_s * self.multiplier**self._streak)

    def failure(self) -> float:
        """Note a failure; the delay to wait before the next attempt."""
        delay = self.peek()
        self._streak += 1
        self.num_failures += 1
        return delay

    def success(self, healthy_for_s: float | None = None) -> None:
        """Note a success; it resets the sequence once it has lasted ``reset_after_s``
        (``None``: an instant success, such as an answered request, resets at once)."""
        if healthy_for_s is None or healthy_for_s >= self.reset_after_s:
            self._streak = 0
