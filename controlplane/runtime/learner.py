"""The latency model a live control plane learns from ingest: one learner, shared by the
admission loop and the planner.

:class:`SharedLearner` wraps one :class:`~controlplane.policies.learning.AdmissionLearner`
(prefill rate, KV handoff, ``itl = a + b·batch + c·context``, mean decode time and
context). It listens to ingest (``Ingestor.add_listener``) while at least one loop is
attached, so each applied batch is learned from once, whichever loops run. Gateway records
spread over the decode pool, so they are divided by the number of decode workers the
fleet had at the last tick of either loop (:func:`count_decode_instances`).

:func:`shared_learner` gives the app's learner (``app.state.learner``), made on first use by
whichever loop's lifespan starts first.

Example::

    learner = shared_learner(app)
    learner.attach()            # ingest feeds it from now on
    params = learner.params()   # LearnedParams
    learner.detach()
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime

from fastapi import FastAPI

from controlplane.ingest.ingestor import Ingestor
from controlplane.models import FleetKind, FleetMember, FleetState, PoolRole
from controlplane.policies.learning import AdmissionLearner, LearnedParams
from controlplane.services.fleet import is_stale
from exporters.records import RecordBatch

__all__ = ["SharedLearner", "count_decode_instances", "shared_learner"]

_STOPPED = (FleetState.DOWN, FleetState.DRAINED)


def count_decode_instances(
    members: Iterable[FleetMember], *, now: datetime, timeout_s: float
) -> int:
    """The workers serving decode now (decode or both; not stale, down or drained); at
    least 1."""
    serving = [
        m
        for m in members
        if m.kind == FleetKind.WORKER
        and m.role != PoolRole.PREFILL
        and m.state not in _STOPPED
        and not is_stale(m, now=now, timeout_s=timeout_s)
    ]
    return max(1, len(serving))


class SharedLearner:
    """One learner fed by ingest, read by the control loops (see the module docstring)."""

    def __init__(self, ingestor: Ingestor, learner: AdmissionLearner | None = None) -> None:
        self.ingestor = ingestor
        self.learner = learner or AdmissionLearner()
        self._lock = threading.Lock()  # ingest listeners run in worker threads
        self._decode_instances = 1
        self._num_attached = 0

    def attach(self) -> None:
        """A loop starts using the learner (the first one starts the ingest listener)."""
        self._num_attached += 1
        if self._num_attached == 1:
            self.ingestor.add_listener(self.observe)

    def detach(self) -> None:
        """A loop stops using the learner (the last one stops the ingest listener)."""
        if self._num_attached == 0:
            return
        self._num_attached -= 1
        if self._num_attached == 0:
            self.ingestor.remove_listener(self.observe)

    def observe(self, batch: RecordBatch, source: str = "") -> None:
        """Learn from one ingested batch of exporter ``source`` (the ingest listener)."""
        with self._lock:
            self.learner.observe(batch, decode_instances=self._decode_instances, source=source)

    def set_decode_instances(self, count: int) -> None:
        """How many decode instances gateway records spread over from now on."""
        with self._lock:
            self._decode_instances = max(1, count)

    @property
    def decode_instances(self) -> int:
        return self._decode_instances

    def params(self) -> LearnedParams:
        """The current estimate."""
        with self._lock:
            return self.learner.params()


def shared_learner(app: FastAPI) -> SharedLearner:
    """The app's one learner (``app.state.learner``), made on first use from the live
    runtime's ingest (``app.state.live``)."""
    learner: SharedLearner | None = getattr(app.state, "learner", None)
    if learner is None:
        learner = SharedLearner(app.state.live.ingestor)
        app.state.learner = learner
    return learner
