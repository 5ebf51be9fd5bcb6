"""Counting role changes, and the requests held by an instance when it changed role."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from exporters.fleet import PoolRole
from serving.gateway.admission import ADMIT, Decision, RequestInfo
from serving.sim.cluster import (
    ClusterSnapshot,
    InstanceView,
    SimOptions,
    Simulator,
    build_workload,
    parse_cluster,
)
from serving.sim.experiments.observe import RoleChangeObserver, job_finished
from serving.sim.instance import Job
from serving.traces import Trace

P, D = PoolRole.PREFILL, PoolRole.DECODE


class Scripted:
    """Returns each fixed plan once, at the first tick at or after its time."""

    def __init__(self, plans: dict[float, dict[str, PoolRole]], interval_s: float = 1.0) -> None:
        self.plans = plans
        self.interval_s = interval_s

    def admit(self, info: RequestInfo) -> Decision:
        del info
        return ADMIT

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        due = sorted(at for at in self.plans if at <= snapshot.now_s + 1e-9)
        out: dict[str, PoolRole] = {}
        for at in due:
            out.update(self.plans.pop(at))
        return out


class Holder:
    def __init__(self, name: str, waiting: list[Job], running: list[Job]) -> None:
        self.name = name
        self.waiting = waiting
        self.running = running


def view(instance_id: str, role: PoolRole) -> InstanceView:
    return InstanceView(instance_id, role, 0, 0, 0.0, 0, 0)


def snapshot(now: float, roles: dict[str, PoolRole]) -> ClusterSnapshot:
    return ClusterSnapshot(now, tuple(view(i, r) for i, r in roles.items()))


def test_only_real_changes_are_counted_and_held_jobs_are_kept() -> None:
    held = Job(7, 0.0, 100, 10)
    policy = Scripted({1.0: {"a": D, "b": D}, 2.0: {"a": D}})
    observer = RoleChangeObserver(policy)
    observer.bind([Holder("a", [held], []), Holder("b", [], [])])
    roles = {"a": P, "b": D}
    assert observer.plan(snapshot(1.0, roles)) == {"a": D, "b": D}  # the plan is unchanged
    roles["a"] = D
    observer.plan(snapshot(2.0, roles))  # "a" is already decode: not a change
    assert observer.num_changes == 1
    change = observer.changes[0]
    assert (change.time_s, change.instance_id, change.old, change.new) == (1.0, "a", P, D)
    assert change.num_jobs == 1
    assert observer.dropped_jobs() == [held]  # never finished
    held.finished_s, held.generated = 3.0, 10
    assert job_finished(held) and observer.dropped_jobs() == []


def test_admit_is_the_wrapped_policy_s_own_method() -> None:
    policy = Scripted({})
    observer = RoleChangeObserver(policy)
    assert observer.admit == policy.admit
    assert observer.interval_s == policy.interval_s


def test_role_changes_under_load_drop_no_request() -> None:
    rng = np.random.default_rng(1)
    n = 400
    trace = Trace(
        np.sort(rng.uniform(0, 20, n)), rng.integers(200, 3000, n), rng.integers(20, 200, n)
    )
    work = build_workload(trace, rate_scale=1.0, duration_s=20.0)
    # Move a busy prefill instance to decode and back, and a decode one to prefill.
    policy = Scripted(
        {5.0: {"prefill-0": D}, 10.0: {"decode-0": P}, 15.0: {"prefill-0": P}}, interval_s=0.5
    )
    observer = RoleChangeObserver(policy)
    sim = Simulator(
        parse_cluster("prefill=2,decode=2"),
        work,
        SimOptions(seed=1, sample_interval_s=0.5),
        observer,
    )
    observer.bind(sim.instances)
    result = sim.run()
    assert [c.instance_id for c in observer.changes] == ["prefill-0", "decode-0", "prefill-0"]
    assert len(observer.held) > 0  # they were busy when they moved
    assert observer.dropped_jobs() == []
    assert result.num_finished == len(work)


def test_final_split_follows_the_role_changes() -> None:
    from serving.sim.experiments.run import run_policy
    from serving.sim.experiments.scenario import Scenario

    policy = Scripted({2.0: {"prefill-0": D}, 4.0: {"decode-0": P, "decode-1": P}})
    out = run_policy(Scenario("azure_conv", 4, 6.0), (2, 2), 2.0, policy)
    assert len(out.role_changes) == 3
    assert out.final_split == (3, 1)
    assert out.row()["final_split"] == "3P:1D"
