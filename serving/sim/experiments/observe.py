"""Watching a policy's role changes: how many, when, and whether the requests an instance
held when it changed role were all finished.

:class:`RoleChangeObserver` wraps a :class:`~serving.sim.cluster.SimPolicy` without
changing what it decides: ``admit`` is the wrapped policy's own bound method, ``plan``
returns the wrapped plan unchanged. Before returning a plan it counts the instances whose
role the plan really changes (a plan may repeat an instance's current role) and keeps the
jobs queued or running on each of them at that moment; after the run,
:meth:`RoleChangeObserver.dropped_jobs` lists those that did not finish with every output
token — the "no request dropped by a role change" check. It reads the simulator's
instances (bound with :meth:`bind`), which a policy proper never sees.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from exporters.fleet import PoolRole
from serving.sim.cluster import ClusterSnapshot, SimPolicy
from serving.sim.instance import Job

__all__ = ["RoleChange", "RoleChangeObserver", "job_finished"]


class _Holds(Protocol):
    """What the observer reads of a simulated instance."""

    name: str

    @property
    def waiting(self) -> Sequence[Job]: ...

    @property
    def running(self) -> Sequence[Job]: ...


@dataclass(frozen=True, slots=True)
class RoleChange:
    """One instance moved from ``old`` to ``new`` at ``time_s``, holding ``num_jobs``."""

    time_s: float
    instance_id: str
    old: PoolRole
    new: PoolRole
    num_jobs: int


def job_finished(job: Job) -> bool:
    """Whether a job ended normally: a finish time and every output token generated."""
    return math.isfinite(job.finished_s) and job.generated >= job.output_tokens


class RoleChangeObserver:
    """Counts the role changes ``policy`` makes (see the module docstring)."""

    def __init__(self, policy: SimPolicy) -> None:
        self.policy = policy
        self.interval_s = policy.interval_s
        self.admit = policy.admit  # the wrapped decision, no extra call per request
        self.changes: list[RoleChange] = []
        self.held: list[Job] = []
        self._instances: dict[str, _Holds] = {}

    def bind(self, instances: Sequence[_Holds]) -> None:
        """Give the observer the simulator's instances (by name) to read jobs from."""
        self._instances = {inst.name: inst for inst in instances}

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        plan = self.policy.plan(snapshot)
        if plan:
            current = {view.id: view.role for view in snapshot.instances}
            for instance_id, role in plan.items():
                old = current.get(instance_id)
                if old is None or PoolRole(role) is old:
                    continue
                inst = self._instances.get(instance_id)
                jobs = [*inst.waiting, *inst.running] if inst is not None else []
                self.held.extend(jobs)
                self.changes.append(
                    RoleChange(snapshot.now_s, instance_id, old, PoolRole(role), len(jobs))
                )
        return plan

    @property
    def num_changes(self) -> int:
        return len(self.changes)

    def dropped_jobs(self) -> list[Job]:
        """Jobs held by an instance when it changed role that did not finish (call after
        the run)."""
        return [job for job in self.held if not job_finished(job)]
