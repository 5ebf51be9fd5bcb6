"""The planners as SimPolicy in the cluster simulator (serving.sim.control.planner):
virtual clock, small clusters, short runs."""

from __future__ import annotations

from collections.abc import Mapping

from exporters.fleet import PoolRole
from serving.gateway.admission import Decision, RequestInfo
from serving.sim.cluster import SimOptions, Simulator, build_workload, parse_cluster
from serving.sim.cluster.policy import ClusterSnapshot, InstanceView, SimPolicy
from serving.sim.control.planner import DynamoPolicy, PlannerPolicy
from serving.traces import load_trace


def info(k: int, at_s: float, prompt: int = 2000, output: int = 50) -> RequestInfo:
    return RequestInfo(f"r{k}", "m", "", "", "", prompt, output, True, at_s)


def snapshot(now_s: float, num_prefill: int, num_decode: int) -> ClusterSnapshot:
    views = [
        InstanceView(f"prefill-{k}", PoolRole.PREFILL, 0, 0, 0.0, 20_000, 0)
        for k in range(num_prefill)
    ] + [InstanceView(f"decode-{k}", PoolRole.DECODE, 0, 1, 0.1, 0, 1) for k in range(num_decode)]
    return ClusterSnapshot(now_s=now_s, instances=tuple(views))


def test_planner_moves_decode_to_a_saturated_prefill_pool() -> None:
    policy = PlannerPolicy(interval_s=5.0)  # TTFT 0.2 s, ITL 0.05 s
    for k in range(600):  # 20 req/s of 2000-token prompts: 40k tokens/s
        policy.admit(info(k, k / 20.0))
    plan = policy.plan(snapshot(30.0, 1, 5))
    assert list(plan.values()) == [PoolRole.PREFILL]
    assert policy.num_moves == 1
    # Dwell: the moved instance stays; the next tick may move another one.
    moved = next(iter(plan))
    again = policy.plan(snapshot(35.0, 1, 5))
    assert moved not in again


def test_dynamo_acts_once_per_interval() -> None:
    policy = DynamoPolicy(interval_s=180.0)
    for k in range(600):
        policy.admit(info(k, k / 20.0))
    first = policy.plan(snapshot(30.0, 1, 5))
    assert set(first.values()) == {PoolRole.PREFILL}
    assert policy.plan(snapshot(60.0, 1, 5)) == {}  # within the interval
    assert DynamoPolicy(interval_s=5.0).interval_s == 5.0


class CountingAdmission:
    interval_s = 1.0

    def __init__(self) -> None:
        self.seen = 0
        self.plans = 0

    def admit(self, info: RequestInfo) -> Decision:
        self.seen += 1
        return Decision(admit=self.seen % 2 == 0, reason="every other")

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        self.plans += 1
        return {}


def test_admission_is_delegated() -> None:
    admission = CountingAdmission()
    policy = PlannerPolicy(admission=admission)
    assert isinstance(policy, SimPolicy)
    assert [policy.admit(info(k, 0.1 * k)).admit for k in range(4)] == [False, True, False, True]
    policy.plan(snapshot(1.0, 1, 1))
    assert admission.plans == 1


def test_in_the_simulator_the_planner_beats_no_control() -> None:
    """A short prefill-starved run: the planner moves decode instances to prefill and
    goodput rises above the uncontrolled run's (same trace, seed and cluster)."""
    trace = load_trace("azure_code")

    def run(policy: SimPolicy | None) -> float:
        spec = parse_cluster("prefill=1,decode=5,model=llama3.1-8b")
        work = build_workload(trace, rate_scale=1.5, duration_s=120)
        return Simulator(spec, work, SimOptions(seed=1), policy=policy).run().stats.goodput_rps

    planner = PlannerPolicy(interval_s=5.0)
    ours, none = run(planner), run(None)
    assert planner.num_moves >= 1
    assert ours > none
