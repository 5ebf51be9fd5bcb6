"""The PD planner tick in the control plane: observe, decide (pure), act by commands.

:class:`PlannerRuntime` is one asyncio task started by the app's lifespan
(:func:`planner_lifespan`, when ``settings.planner_enabled``; ``app.state.planner``). It
listens to ingest (``Ingestor.add_listener``): every applied batch feeds the demand window
(:class:`~controlplane.policies.planner_demand.DemandWindow`). Its capacities come from the
control plane's one latency model learner
(:class:`~controlplane.runtime.learner.SharedLearner`, shared with admission: prefill rate,
KV handoff, ``itl = a + b·batch + c·context``). Every ``planner_interval_s`` one tick, in one
transaction:

1. a paused planner (``POST /automation/pause``) stops here: it issues nothing at all, and
   moves in progress wait where they are;
2. advances the role moves in progress (``controlplane.services.automation``: drain →
   set_role + resume → done) and records the observed effect of moves done
   ``planner_observe_after_s`` ago (the goodput engine's last minute per SLO, beside the
   prediction; a planner move's predicted and observed goodput are also kept, once the tick
   commits, for ``goodput_planner_move_*_goodput_rps``);
3. builds the planner's snapshot (``controlplane.runtime.planner_snapshot.build_snapshot``) from
   the fleet registry's heartbeats (role, state, ``num_requests_running``,
   ``num_requests_waiting``, optional ``prefill_queue_tokens``, ``decode_context_tokens``,
   ``prefill_tokens_per_s``, ``kv_both``), the pins, the moves in progress, the demand, the
   learned model and the SLO registry's targets (``controlplane.policies.targets``), runs
   :func:`controlplane.policies.planner.plan`, and starts a role move (``drain`` first) for
   each instance it moves, with the plan's evidence and predicted effect.

Gateways need no command: they read pool membership from the fleet registry, where a
draining worker is not ``ready`` (no new requests) and a switched worker re-registers with
its new role. A failing tick is logged once per failure streak and counted; the loop goes on.

Example::

    runtime = PlannerRuntime(
        app.state.sessions, settings, app.state.live, learner=shared_learner(app)
    )
    await runtime.start()
    ...
    await runtime.stop()
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import FleetKind, FleetMember, MoveState, PoolRole, RoleMove
from controlplane.policies.planner import (
    Plan,
    PlannerConfig,
    SLOTargets,
    plan,
    service_model,
)
from controlplane.policies.planner_demand import DemandWindow
from controlplane.policies.targets import slo_targets
from controlplane.runtime.learner import count_decode_instances
from controlplane.runtime.loop import ControlLoop, loop_lifespan
from controlplane.runtime.loop_metrics import MoveEffect, PlannerCollector
from controlplane.runtime.planner_snapshot import build_snapshot
from controlplane.schemas.automation import TickPublic
from controlplane.services import automation
from controlplane.settings import Settings
from exporters.records import RecordBatch

__all__ = ["PLANNER_ACTOR", "PlannerRuntime", "planner_lifespan"]

PLANNER_ACTOR = "planner"


class PlannerRuntime(ControlLoop):
    """The planner's loop inside the app (see the module docstring)."""

    name = "planner"

    def setup(self) -> None:
        settings = self.settings
        self.demand = DemandWindow(settings.planner_window_s)
        self.config = PlannerConfig(
            min_gain_ratio=settings.planner_min_gain_ratio,
            min_dwell_s=settings.planner_min_dwell_s,
            max_moves_per_tick=settings.planner_max_moves_per_tick,
        )
        self.timings = automation.MoveTimings(
            ttl_s=settings.planner_command_ttl_s,
            drain_timeout_s=settings.planner_drain_timeout_s,
            observe_after_s=settings.planner_observe_after_s,
        )
        self.last_tick: TickPublic | None = None
        self.last_plan: Plan | None = None
        # Moves started, by the pool they move to (goodput_planner_moves_total).
        self.moves_started: dict[str, int] = {}
        # The last planner move to each pool whose effect was recorded
        # (goodput_planner_move_{predicted,observed}_goodput_rps).
        self.move_effects: dict[str, MoveEffect] = {}

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def interval_s(self) -> float:
        return self.settings.planner_interval_s

    async def start(self) -> None:
        self.live.ingestor.add_listener(self.observe)
        await super().start()

    async def stop(self) -> None:
        self.live.ingestor.remove_listener(self.observe)
        await super().stop()

    def observe(self, batch: RecordBatch, source: str = "") -> None:
        """The ingest listener: the demand window sees every batch (``source``: the
        sending exporter)."""
        self.demand.observe(batch, self.clock())

    # -- one tick ---------------------------------------------------------------------------

    async def tick(self) -> TickPublic:
        """One tick (see the module docstring); what it did."""
        started = time.perf_counter()
        now_s = self.clock()
        now = datetime.fromtimestamp(now_s, UTC)
        effects: list[tuple[str, MoveEffect]] = []  # planner moves' effects recorded
        async with self.sessions() as session, session.begin():
            await self.fence(session)
            state = await automation.get_state(session)
            if state is not None and state.paused:
                return self._done(now, started, paused=True, reason=f"paused: {state.reason}")
            members = {
                m.id: m
                for m in await session.scalars(
                    sa.select(FleetMember).where(FleetMember.kind == FleetKind.WORKER)
                )
            }
            advanced, observed = await self._advance(session, members, now, effects)
            result = await self._plan(session, members, now)
            moves = []
            if result is not None:
                for move in result.moves:
                    evidence = {
                        **result.evidence,
                        "reason": result.reason,
                        "instance": dict(move.evidence),
                    }
                    row = await automation.start_move(
                        session,
                        members[move.instance_id],
                        move.to_role,
                        mode=move.mode,
                        evidence=evidence,
                        predicted=dict(move.predicted),
                        actor=PLANNER_ACTOR,
                        now=now,
                        timings=self.timings,
                    )
                    moves.append(row.id)
        # Committed: keep the effects recorded, count the moves and keep the plan
        # (controlplane.runtime.loop_metrics).
        self.move_effects.update(effects)
        if result is None:
            return self._done(
                now,
                started,
                reason="no SLO constrains TTFT or ITL",
                advanced=advanced,
                observed=observed,
            )
        for move in result.moves:
            role = move.to_role.value
            self.moves_started[role] = self.moves_started.get(role, 0) + 1
        self.last_plan = result
        return self._done(
            now,
            started,
            reason=result.reason,
            moves=moves,
            advanced=advanced,
            observed=observed,
            evidence=dict(result.evidence),
        )

    async def _advance(
        self,
        session: AsyncSession,
        members: Mapping[str, FleetMember],
        now: datetime,
        effects: list[tuple[str, MoveEffect]],
    ) -> tuple[int, int]:
        """Advance the open moves and record the effect of those due; the planner's own
        moves' effects are appended to ``effects`` (kept once the tick commits)."""
        rows = await session.scalars(
            sa.select(RoleMove).where(
                sa.or_(
                    RoleMove.state.in_(automation.OPEN_MOVES),
                    sa.and_(
                        RoleMove.state == MoveState.DONE,
                        RoleMove.observed_effect.is_(None),
                        RoleMove.observe_at <= now,
                    ),
                )
            )
        )
        advanced = observed = 0
        for move in list(rows):
            if move.state is MoveState.DONE:
                effect = self._observed(move, members, now)
                await automation.record_observed(session, move, effect)
                if move.source == PLANNER_ACTOR:
                    effects.append((move.to_role.value, MoveEffect.of(effect)))
                observed += 1
            elif await automation.advance_move(
                session,
                move,
                members.get(move.member_id),
                actor=PLANNER_ACTOR,
                now=now,
                timings=self.timings,
            ):
                advanced += 1
        await session.flush()
        return advanced, observed

    async def _plan(
        self, session: AsyncSession, members: Mapping[str, FleetMember], now: datetime
    ) -> Plan | None:
        slo = slo_targets(spec.objectives for spec in self.live.engine.slos)
        if slo is None:
            return None
        pins = [p.member_id for p in await automation.list_pins(session)]
        moving = {
            m.member_id: m.to_role
            for m in await session.scalars(
                sa.select(RoleMove).where(RoleMove.state.in_(automation.OPEN_MOVES))
            )
        }
        changes = await session.execute(
            sa.select(RoleMove.member_id, sa.func.max(RoleMove.updated_at))
            # A failed move counts too: a worker that refuses is not retried every tick.
            .where(RoleMove.state.in_((MoveState.DONE, MoveState.FAILED)))
            .group_by(RoleMove.member_id)
        )
        last_change = {member_id: at for member_id, at in changes}
        # The numpy work (demand, engine summary, the plan) runs off the event loop.
        return await asyncio.to_thread(
            self._decide,
            list(members.values()),
            pins=pins,
            moving=moving,
            last_change=last_change,
            slo=slo,
            now=now,
        )

    def _decide(
        self,
        members: list[FleetMember],
        *,
        pins: list[str],
        moving: Mapping[str, PoolRole],
        last_change: Mapping[str, datetime],
        slo: SLOTargets,
        now: datetime,
    ) -> Plan:
        stale_after_s = self.settings.fleet_heartbeat_timeout_s
        self.learner.set_decode_instances(
            count_decode_instances(members, now=now, timeout_s=stale_after_s)
        )
        params = self.learner.params()
        snapshot = build_snapshot(
            members,
            now=now,
            stale_after_s=stale_after_s,
            pinned=pins,
            moving=moving,
            last_change=last_change,
            demand=self.demand.demand(now.timestamp()),
            model=service_model(params),
            slo=slo,
            observed_ttft_attainment_ratio=self._observed_ttft(now),
        )
        return plan(snapshot, self.config)

    def _summary(self, now: datetime) -> list[Any]:
        return self.live.engine.summary(now=now.timestamp(), window="1m", percentiles=False)

    def _observed_ttft(self, now: datetime) -> float | None:
        best: tuple[int, float] | None = None
        for stats in self._summary(now):
            ttft_keys = [k for k in stats.violations if k.startswith("ttft")]
            if stats.requests <= 0:
                continue
            missed = sum(stats.violations[k] for k in ttft_keys)
            ratio = 1.0 - min(missed, stats.requests) / stats.requests
            if best is None or stats.requests > best[0]:
                best = (stats.requests, ratio)
        return None if best is None else best[1]

    def _observed(
        self, move: RoleMove, members: Mapping[str, FleetMember], now: datetime
    ) -> dict[str, Any]:
        pools = {"prefill": 0, "decode": 0, "both": 0}
        for member in members.values():
            pools[member.role.value] += 1
        slos = [
            {
                "slo_id": s.slo_id,
                "slo": s.slo_name,
                "requests": s.requests,
                "goodput_rps": s.goodput_rps,
                "attainment_ratio": s.attainment_ratio,
                "throughput_rps": s.throughput_rps,
            }
            for s in self._summary(now)
        ]
        after = (move.predicted_effect or {}).get("after", {})
        observed_goodput = max((s["goodput_rps"] for s in slos), default=0.0)
        return {
            "time": now.isoformat(),
            "window_s": 60.0,
            "pools": pools,
            "slos": slos,
            "observed_goodput_rps": observed_goodput,
            "predicted_goodput_rps": after.get("goodput_rps"),
            "ttft_attainment_ratio": self._observed_ttft(now),
        }

    def _done(
        self,
        now: datetime,
        started: float,
        *,
        paused: bool = False,
        reason: str = "",
        moves: list[Any] | None = None,
        advanced: int = 0,
        observed: int = 0,
        evidence: dict[str, Any] | None = None,
    ) -> TickPublic:
        self.last_tick = TickPublic(
            time=now,
            paused=paused,
            reason=reason,
            moves_started=moves or [],
            moves_advanced=advanced,
            observed=observed,
            duration_ms=(time.perf_counter() - started) * 1e3,
            evidence=evidence or {},
        )
        return self.last_tick


@asynccontextmanager
async def planner_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Run the planner on ``app.state.planner`` when ``settings.planner_enabled``
    (:func:`controlplane.runtime.loop.loop_lifespan`), its metrics
    (:class:`~controlplane.runtime.loop_metrics.PlannerCollector`) on the app's registry."""
    settings: Settings = app.state.settings
    async with loop_lifespan(app, PlannerRuntime, enabled=settings.planner_enabled):
        planner = app.state.planner
        registry = getattr(app.state, "metrics_registry", None)
        if planner is None or registry is None:
            yield
            return
        collector = PlannerCollector(planner)
        registry.register(collector)
        try:
            yield
        finally:
            registry.unregister(collector)
