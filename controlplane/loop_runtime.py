"""What the control plane's loops (admission, PD planner) share at run time: how the app's
lifespan starts and stops one.

Each loop is one asyncio task with ``start()`` and ``stop()``; :func:`loop_lifespan` makes it
with the app's one latency learner (:func:`controlplane.learner_runtime.shared_learner`),
starts it on ``app.state.<name>`` when enabled (``None`` there otherwise) and stops it when
the app shuts down. It runs after ``live_lifespan``: the loops listen to its ingest.

Example::

    @asynccontextmanager
    async def planner_lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings = app.state.settings
        async with loop_lifespan(app, "planner", settings.planner_enabled, lambda learner:
                PlannerRuntime(app.state.sessions, settings, app.state.live, learner=learner)):
            yield
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

from fastapi import FastAPI

from controlplane.learner_runtime import SharedLearner, shared_learner

__all__ = ["ControlLoop", "loop_lifespan"]


class ControlLoop(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@asynccontextmanager
async def loop_lifespan(
    app: FastAPI, name: str, enabled: bool, make: Callable[[SharedLearner], ControlLoop]
) -> AsyncIterator[None]:
    """Run the loop ``make`` builds on ``app.state.<name>`` while the app runs, when
    ``enabled`` (see the module docstring)."""
    if not enabled:
        setattr(app.state, name, None)
        yield
        return
    loop = make(shared_learner(app))
    await loop.start()
    setattr(app.state, name, loop)
    try:
        yield
    finally:
        await loop.stop()
