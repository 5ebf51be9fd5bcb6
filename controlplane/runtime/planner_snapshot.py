"""The planner's snapshot from the control plane's state: fleet rows with their heartbeat
loads, pins, moves in progress, the demand, the learned model and the SLO registry's
targets, turned into a :class:`~controlplane.policies.planner.PlannerSnapshot`. Pure
(no I/O: the runtime does the queries), one pass over the rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from controlplane.models import FleetKind, FleetMember, FleetState
from controlplane.policies.planner import (
    Demand,
    InstanceLoad,
    PlannerSnapshot,
    ServiceModel,
    SLOTargets,
)
from exporters.fleet import PoolRole

__all__ = ["build_snapshot"]


def _number(load: Mapping[str, Any], key: str) -> float | None:
    """A non-negative finite number under ``key`` (``None`` when absent or anything else)."""
    value = load.get(key)
    kind = type(value)
    if kind is not int and kind is not float:  # bool is neither
        return None
    number = float(value)  # type: ignore[arg-type]
    return number if 0 <= number < math.inf else None


def build_snapshot(
    members: Iterable[FleetMember],
    *,
    now: datetime,
    stale_after_s: float,
    pinned: Iterable[str],
    moving: Mapping[str, PoolRole],
    last_change: Mapping[str, datetime],
    demand: Demand,
    model: ServiceModel,
    slo: SLOTargets,
    observed_ttft_attainment_ratio: float | None = None,
) -> PlannerSnapshot:
    """The planner's view of the fleet (see the module docstring). Workers that are down,
    starting or stale are left out: they serve nothing the planner could count on."""
    pins = set(pinned)
    rps = demand.requests_per_s
    mean_prompt = demand.prompt_tokens_per_s / rps if rps > 0 else 0.0
    context = (demand.prompt_tokens_per_s + 0.5 * demand.output_tokens_per_s) / rps if rps else 0.0
    stale = now - timedelta(seconds=stale_after_s)
    now_s = now.timestamp()
    instances = []
    skip = (FleetState.DOWN, FleetState.STARTING)
    drained = (FleetState.DRAINING, FleetState.DRAINED)
    for member in members:
        # One read of each ORM attribute (instrumented reads are the cost at 1,000 rows).
        kind, beat, state = member.kind, member.last_heartbeat_at, member.state
        if kind is not FleetKind.WORKER or beat is None or beat < stale or state in skip:
            continue
        member_id, role, load = member.id, member.role, member.load or {}
        running = _number(load, "num_requests_running") or 0.0
        queued = _number(load, "prefill_queue_tokens")
        if queued is None:
            queued = (running + (_number(load, "num_requests_waiting") or 0.0)) * mean_prompt
        held = _number(load, "decode_context_tokens")
        target = moving.get(member_id)
        changed = last_change.get(member_id)
        instances.append(
            InstanceLoad(
                id=member_id,
                role=role,
                prefill_queue_tokens=queued,
                decode_streams=int(running) if role is not PoolRole.PREFILL else 0,
                decode_context_tokens=held if held is not None else running * context,
                prefill_tokens_per_s=_number(load, "prefill_tokens_per_s") or None,
                draining=state in drained or target is not None,
                moving_to=target,
                pinned=member_id in pins,
                last_role_change_s=-math.inf if changed is None else changed.timestamp(),
                live_switch=load.get("kv_both", True) is not False,
            )
        )
    return PlannerSnapshot(
        now_s=now_s,
        instances=instances,
        demand=demand,
        model=model,
        slo=slo,
        observed_ttft_attainment_ratio=observed_ttft_attainment_ratio,
    )
