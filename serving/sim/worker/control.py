"""The fleet side of a sim worker: its role and drain state, reported through the agent.

The same commands as a vLLM worker (:class:`~serving.workers.supervisor.WorkerSupervisor`)
and the same agent (:class:`~serving.workers.agent.Agent`): ``drain`` reports
``draining`` and then ``drained`` once nothing runs or waits, ``resume`` undoes it,
``set_role`` changes the reported pool (the engine serves either phase, like vLLM's
``kv_both`` instances: no restart). The load in registrations and heartbeats is the
engine's own state (:attr:`SimEngine.load`), not a scrape of ``/metrics``.

A control made with ``starting=True`` reports ``starting`` until :meth:`mark_serving`
(the server's lifespan calls it once the engine runs) and ``down`` after
:meth:`mark_stopped`, so ``/ready`` (:class:`~serving.workers.readiness.ReadinessServer`
on :attr:`SimWorkerControl.state`) answers as a vLLM worker's does: 200 only while
``ready``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from exporters.commands import CommandKind
from exporters.fleet import FleetState, PoolRole
from serving.sim.worker.engine import SimEngine
from serving.workers.agent import AgentReport

__all__ = ["SimWorkerControl"]


class SimWorkerControl:
    """Role and drain state of one sim worker (see the module docstring)."""

    def __init__(self, engine: SimEngine, role: PoolRole, *, starting: bool = False) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._role = PoolRole(role)
        self._draining = False
        # STARTING, READY (serving; drain applies) or DOWN
        self._lifecycle = FleetState.STARTING if starting else FleetState.READY

    @property
    def role(self) -> PoolRole:
        return self._role

    @property
    def state(self) -> FleetState:
        if self._lifecycle is not FleetState.READY or not self._draining:
            return self._lifecycle
        return FleetState.DRAINED if self.engine.load.idle else FleetState.DRAINING

    def mark_serving(self) -> None:
        """The engine runs: ``ready`` (or the drain state) from now on."""
        self._lifecycle = FleetState.READY

    def mark_stopped(self) -> None:
        """The server is shutting down: ``down`` from now on."""
        self._lifecycle = FleetState.DOWN

    def report(self) -> AgentReport:
        """Role, state and load for the agent's registration and heartbeats."""
        with self._lock:
            load: dict[str, Any] = dict(self.engine.load.as_report())
            load["num_restarts"] = 0
            return AgentReport(role=self._role, state=self.state, load=load)

    def apply_command(self, kind: CommandKind, payload: Mapping[str, Any]) -> str:
        """Apply ``drain``, ``resume`` or ``set_role``; the detail for the acknowledgement."""
        with self._lock:
            if kind is CommandKind.DRAIN:
                self._draining = True
                return f"draining ({self.state})"
            if kind is CommandKind.RESUME:
                self._draining = False
                return f"resumed ({self.state})"
            if kind is CommandKind.SET_ROLE:
                old, self._role = self._role, PoolRole(payload["role"])
                return f"role {old} -> {self._role} (sim engine serves both phases: no restart)"
        raise ValueError(f"kind {kind.value!r} is not a worker command")
