"""What the control plane's loops (admission, PD planner) share at run time.

:class:`ControlLoop` is one asyncio task: every ``interval_s`` it runs the subclass's
``tick`` (one transaction: read state, decide with a pure policy, act). A failing tick (the
database away) is logged once per failure streak and counted; the loop goes on. The loop
reads the control plane's one latency learner, attached while it runs.

:func:`loop_lifespan` makes a loop with the app's learner
(:func:`controlplane.runtime.learner.shared_learner`), starts it on ``app.state.<name>`` when
enabled (``None`` there otherwise) and stops it when the app shuts down. It runs after
``live_lifespan``: the loops listen to its ingest.

Example::

    @asynccontextmanager
    async def planner_lifespan(app: FastAPI) -> AsyncIterator[None]:
        enabled = app.state.settings.planner_enabled
        async with loop_lifespan(app, PlannerRuntime, enabled=enabled):
            yield
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from controlplane.errors import describe_error
from controlplane.runtime.leadership import DeposedError, Leadership
from controlplane.runtime.learner import SharedLearner, shared_learner
from controlplane.runtime.live import LiveGoodput
from controlplane.settings import Settings

__all__ = ["ControlLoop", "loop_lifespan"]

logger = logging.getLogger(__name__)

_STOP_GRACE_S = 5.0


class ControlLoop(ABC):
    """A control loop (see the module docstring). Subclasses set ``name``, give
    ``interval_s`` and ``tick``, and make their own state in ``setup``."""

    name = "control"

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: Settings,
        live: LiveGoodput,
        *,
        learner: SharedLearner | None = None,
        leadership: Leadership | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sessions = sessions
        self.leadership = leadership
        self.settings = settings
        self.live = live
        self.clock = clock
        self.learner = learner or SharedLearner(live.ingestor)
        self.stopping = asyncio.Event()
        self.num_ticks = 0
        self.num_failures = 0
        self.num_followed = 0  # ticks skipped: another replica leads
        self._failing = False
        self._task: asyncio.Task[None] | None = None
        self.setup()

    def setup(self) -> None:  # noqa: B027 (optional hook: a loop without state of its own)
        """The subclass's own state (its settings are ``self.settings``)."""

    @property
    @abstractmethod
    def interval_s(self) -> float:
        """Seconds between ticks (read from the loop's settings)."""

    @abstractmethod
    async def tick(self) -> object:
        """One round; raises when it fails (the loop counts and logs it)."""

    async def start(self) -> None:
        self.learner.attach()
        self._task = asyncio.create_task(self._run(), name=f"goodput-{self.name}")

    async def stop(self) -> None:
        """Stop ticking; a tick in progress gets a few seconds to finish."""
        self.stopping.set()
        self.learner.detach()
        task, self._task = self._task, None
        if task is None:
            return
        await asyncio.wait({task}, timeout=_STOP_GRACE_S)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def fence(self, session: AsyncSession) -> None:
        """The first statement of every tick's transaction: raises
        :class:`~controlplane.runtime.leadership.DeposedError` when another replica took the lead
        since this one last renewed (the transaction then writes nothing)."""
        if self.leadership is not None:
            await self.leadership.fence(session)

    async def run_tick(self) -> bool:
        """One tick, its failure counted and logged once per streak; whether it worked.
        A replica that does not lead skips the tick (it follows)."""
        if self.leadership is not None and not self.leadership.is_leader():
            self.num_followed += 1
            return False
        try:
            await self.tick()
        except DeposedError as exc:  # a takeover between the renewal and this transaction
            logger.warning("%s tick refused: %s", self.name, exc)
            return False
        except Exception as exc:  # the database may be away: try again next tick
            self.num_failures += 1
            if not self._failing:
                logger.warning("%s tick failed (%s); retrying", self.name, describe_error(exc))
            self._failing = True
            return False
        if self._failing:
            logger.warning("%s ticks work again", self.name)
        self._failing = False
        self.num_ticks += 1
        return True

    async def _run(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=self.interval_s)
                return
            await self.run_tick()


@asynccontextmanager
async def loop_lifespan(
    app: FastAPI, kind: type[ControlLoop], *, enabled: bool
) -> AsyncIterator[None]:
    """Run a ``kind`` loop on ``app.state.<kind.name>`` while the app runs, when ``enabled``
    (see the module docstring)."""
    if not enabled:
        setattr(app.state, kind.name, None)
        yield
        return
    state = app.state
    loop = kind(
        state.sessions,
        state.settings,
        state.live,
        learner=shared_learner(app),
        leadership=getattr(state, "leadership", None),
    )
    await loop.start()
    setattr(app.state, kind.name, loop)
    try:
        yield
    finally:
        await loop.stop()
