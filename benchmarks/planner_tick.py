"""Benchmark: one PD planner tick for a fleet of 1,000 instances (goal ≤ 50 ms).

A tick's compute, as ``controlplane.runtime.planner`` runs it after its queries: the
snapshot from the fleet registry's rows
(:func:`~controlplane.runtime.planner_snapshot.build_snapshot` over 1,000 ``FleetMember``
rows with heartbeat loads, a few pinned, a few moving, some stale) and
:func:`controlplane.policies.planner.plan` on it (every candidate split, the TTFT correction
search, the choice of instances). Demand and load change every tick (prefill-heavy and
decode-heavy phases), so ticks with and without moves are both timed.
In the same run, the baseline is the Dynamo-style planner's tick on the same snapshot
(:class:`~controlplane.policies.dynamo.DynamoPlanner`: two replica formulas and a split),
timed the same way.

Run from the repo root: ``python benchmarks/planner_tick.py [--quick]``. The last line is
one JSON object: ``tick_ms`` (p50 of our tick), ``tick_p99_ms``, ``plan_ms`` (p50 of
``plan`` alone), ``baseline_tick_ms`` (Dynamo-style, p50), ``ratio`` (ours ÷ baseline),
``instances``, ``ticks``, ``moves``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from controlplane.models import FleetKind, FleetMember, FleetState, PoolRole  # noqa: E402
from controlplane.policies.dynamo import (  # noqa: E402
    DynamoConfig,
    DynamoObservation,
    DynamoPlanner,
    ServiceModelProfile,
)
from controlplane.policies.planner import (  # noqa: E402
    Demand,
    PlannerConfig,
    ServiceModel,
    SLOTargets,
    plan,
)
from controlplane.runtime.planner_snapshot import build_snapshot  # noqa: E402

# H100 Llama-3.1-8B-like capacities (the simulator's fitted profile, rounded).
MODEL = ServiceModel(32_000.0, 0.0085, 1.45e-5, 4.9e-8, 0.001)
SLO = SLOTargets(ttft_s=0.5, itl_s=0.05)


def fleet(n: int, now: datetime, rng: np.random.Generator) -> list[FleetMember]:
    members = []
    for k in range(n):
        role = PoolRole.PREFILL if k < n // 3 else PoolRole.DECODE
        state = FleetState.DRAINING if k % 97 == 0 else FleetState.READY
        stale = k % 211 == 0
        members.append(
            FleetMember(
                id=f"w{k:04d}",
                kind=FleetKind.WORKER,
                endpoint=f"http://10.0.{k // 256}.{k % 256}:8100",
                role=role,
                state=state,
                last_heartbeat_at=now - timedelta(seconds=600 if stale else 2),
                load={
                    "num_requests_running": int(rng.integers(0, 64)),
                    "num_requests_waiting": int(rng.integers(0, 8)),
                    "kv_cache_usage_ratio": float(rng.random()),
                },
            )
        )
    return members


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer ticks")
    parser.add_argument("--instances", type=int, default=1000)
    args = parser.parse_args()
    ticks = 40 if args.quick else 300
    rng = np.random.default_rng(7)
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    members = fleet(args.instances, now, rng)
    pinned = [m.id for m in members[::50]]
    moving = {m.id: PoolRole.PREFILL for m in members[-20:-10]}
    last_change = {m.id: now - timedelta(seconds=30) for m in members[::7]}
    config = PlannerConfig(min_dwell_s=60.0, max_moves_per_tick=4)
    dynamo = DynamoConfig(ttft_s=SLO.ttft_s, itl_s=SLO.itl_s, interval_s=1e-9)
    ours_ms: list[float] = []
    plan_ms: list[float] = []
    base_ms: list[float] = []
    moves = 0
    for t in range(ticks + 5):
        # Alternate prefill-heavy and decode-heavy minutes; jitter the load.
        rps = float(rng.uniform(200.0, 400.0))
        prompt = 3000.0 if (t // 20) % 2 == 0 else 400.0
        output = 150.0 if (t // 20) % 2 == 0 else 900.0
        demand = Demand(rps, rps * prompt, rps * output, arrival_scv=float(rng.uniform(1, 20)))
        for m in rng.choice(len(members), size=50, replace=False):
            members[m].load = {**members[m].load, "num_requests_running": int(rng.integers(0, 64))}
        tick_now = now + timedelta(seconds=5 * t)
        gc.collect()  # the harness's garbage is not the tick's
        start = time.perf_counter()
        snapshot = build_snapshot(
            members,
            now=tick_now,
            stale_after_s=30.0 + 5 * t,
            pinned=pinned,
            moving=moving,
            last_change=last_change,
            demand=demand,
            model=MODEL,
            slo=SLO,
            observed_ttft_attainment_ratio=0.9,
        )
        built = time.perf_counter()
        result = plan(snapshot, config)
        done = time.perf_counter()
        # Baseline on the same rows: the snapshot, then Dynamo's formulas and split.
        b0 = time.perf_counter()
        base_snapshot = build_snapshot(
            members,
            now=tick_now,
            stale_after_s=30.0 + 5 * t,
            pinned=pinned,
            moving=moving,
            last_change=last_change,
            demand=demand,
            model=MODEL,
            slo=SLO,
        )
        obs = DynamoObservation(
            num_requests=rps * 60.0,
            duration_s=60.0,
            isl=prompt,
            osl=output,
            ttft_s=0.4,
            itl_s=0.03,
            decode_batch=32.0,
        )
        DynamoPlanner(ServiceModelProfile(MODEL), dynamo).plan(
            base_snapshot.now_s, base_snapshot.instances, obs
        )
        b1 = time.perf_counter()
        if t >= 5:  # warm-up ticks are not counted
            ours_ms.append((done - start) * 1e3)
            plan_ms.append((done - built) * 1e3)
            base_ms.append((b1 - b0) * 1e3)
            moves += len(result.moves)
    tick = percentile(ours_ms, 50)
    baseline = percentile(base_ms, 50)
    print(
        f"{args.instances} instances, {ticks} ticks: ours p50 {tick:.2f} ms "
        f"(plan alone {percentile(plan_ms, 50):.2f} ms), p99 {percentile(ours_ms, 99):.2f} ms; "
        f"Dynamo-style p50 {baseline:.2f} ms; {moves} moves planned"
    )
    print(
        json.dumps(
            {
                "tick_ms": round(tick, 3),
                "tick_p99_ms": round(percentile(ours_ms, 99), 3),
                "plan_ms": round(percentile(plan_ms, 50), 3),
                "baseline_tick_ms": round(baseline, 3),
                "ratio": round(tick / baseline, 3),
                "instances": args.instances,
                "ticks": ticks,
                "moves": moves,
            }
        )
    )


if __name__ == "__main__":
    main()
