"""Admission in the control plane: learn from ingest, push versioned policies to gateways.

:class:`AdmissionRuntime` is one asyncio task started by the app's lifespan
(:func:`admission_lifespan`, when ``settings.admission_enabled``; ``app.state.admission``).

* **Learn.** It reads the control plane's one latency model learner
  (:class:`~controlplane.runtime.learner.SharedLearner`, shared with the planner: prefill
  rate, KV handoff, ``itl = a + b·batch + c·context``, mean decode time and context), fed by
  ingest; each tick tells it how many decode workers the fleet has.
* **Decide (pure).** Every ``admission_interval_s``:
  :func:`controlplane.policies.admission.compute_policy` from the learned parameters, the
  engine's SLO set and each SLO's burn rate over the last ``admission_burn_window_s``.
* **Split.** The gateways in front of the fleet share its capacity: each live gateway's
  policy carries its ``share_ratio``
  (:func:`controlplane.policies.admission.gateway_shares`, from the ``offered_rps`` its
  heartbeats report), so together they admit what one gateway would (docs/scale-out.md).
  A gateway that reports no ``offered_rps`` predates the field and is sent none.
* **Act.** In one transaction, a ``set_admission_policy`` command to every gateway in the
  fleet registry that is not down, stopped or stale, and whose last policy differs from
  this one (beyond the 3rd significant digit; its share by more than
  :data:`SHARE_RESEND_RATIO`) or is half-way through its TTL: persisted
  (state ``pending``, the policy in the payload, the learned parameters and burn rates as
  the evidence), audited (``command.issue`` by ``controlplane:admission``), delivered by
  the gateways' poll and acknowledged like any command. The policy's ``version`` is one
  above the highest issued for that kind, the same for every gateway of a tick. Commands
  live as long as the policy's TTL (``admission_policy_ttl_s``): a gateway that was away
  gets the newest, the older ones expire. (A gateway restarted under the same id waits at
  most half a TTL for its next policy, admitting everything meanwhile.)

A failing tick (database away) is logged once per failure streak and counted; the gateways
keep the last policy for its TTL, then fall back to their concurrency cap.

Example::

    runtime = AdmissionRuntime(
        app.state.sessions, settings, app.state.live, learner=shared_learner(app)
    )
    await runtime.start()
    ...
    await runtime.stop()
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import Command, FleetKind, FleetMember, FleetState
from controlplane.policies.admission import AdmissionConfig, compute_policy, gateway_shares
from controlplane.runtime.learner import count_decode_instances
from controlplane.runtime.loop import ControlLoop, loop_lifespan
from controlplane.services.commands import issue_automatic
from controlplane.services.fleet import is_stale
from controlplane.settings import Settings
from exporters.admission import AdmissionPolicy
from exporters.commands import CommandKind
from exporters.fleet import OFFERED_RPS

__all__ = [
    "ACTOR",
    "SHARE_RESEND_RATIO",
    "AdmissionRuntime",
    "admission_lifespan",
    "fingerprint",
    "offered_rps",
]

ACTOR = "controlplane:admission"
_KIND = CommandKind.SET_ADMISSION_POLICY
_STOPPED = (FleetState.DOWN, FleetState.DRAINED)
#: A gateway's share moved by more than this fraction of the share it was last sent: the
#: policy is sent again (smaller moves wait for the next change or the half-TTL re-send,
#: so the noise of the offered rates does not issue a command per gateway per tick).
SHARE_RESEND_RATIO = 0.05


def offered_rps(load: Any) -> float | None:
    """The offered requests/s a gateway's heartbeat reported (``None``: none, or not a
    finite number ≥ 0)."""
    value = load.get(OFFERED_RPS) if isinstance(load, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _ns(moment: datetime) -> int:
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1_000


def fingerprint(policy: AdmissionPolicy) -> str:
    """The policy without its version, numbers to 3 significant digits: two policies with
    one fingerprint decide alike, so re-sending one would change nothing."""

    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return float(f"{value:.3g}")
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        return value

    body = policy.to_json()
    del body["version"]
    return json.dumps(rounded(body), sort_keys=True)


class AdmissionRuntime(ControlLoop):
    """The admission loop (see the module docstring)."""

    name = "admission"

    def setup(self) -> None:
        settings = self.settings
        self.config = AdmissionConfig(
            ttl_s=settings.admission_policy_ttl_s,
            fallback_max_concurrency=settings.admission_fallback_max_concurrency,
        )
        self.last_policy: AdmissionPolicy | None = None
        self.last_shares: dict[str, float] = {}  # gateway → its share of the last tick
        # gateway → (fingerprint without the share, share, sent at)
        self._sent: dict[str, tuple[str, float, float]] = {}

    @property
    def interval_s(self) -> float:
        return self.settings.admission_interval_s

    async def tick(self) -> int:
        """One policy for every live gateway; the number of commands issued."""
        now_s = self.clock()
        now = datetime.fromtimestamp(now_s, UTC)
        params = self.learner.params()
        engine = self.live.engine
        stats = await asyncio.to_thread(
            engine.summary, now_s, self.settings.admission_burn_window_s, percentiles=False
        )
        burn = {s.slo_id: s.burn_rate for s in stats}
        timeout_s = self.settings.fleet_heartbeat_timeout_s
        async with self.sessions() as session, session.begin():
            await self.fence(session)
            members = list(await session.scalars(sa.select(FleetMember)))
            self.learner.set_decode_instances(
                count_decode_instances(members, now=now, timeout_s=timeout_s)
            )
            gateways = [
                m
                for m in members
                if m.kind == FleetKind.GATEWAY
                and m.state not in _STOPPED
                and not is_stale(m, now=now, timeout_s=timeout_s)
            ]
            if not gateways:
                return 0
            highest = await session.scalar(
                sa.select(sa.func.max(Command.version)).where(Command.kind == _KIND.value)
            )
            version = int(highest or 0) + 1
            policy = compute_policy(params, engine.slos, burn, self.config, version=version)
            rates = {g.id: offered_rps(g.load) for g in gateways}
            shares = gateway_shares(rates, floor_ratio=self.config.gateway_share_floor_ratio)
            evidence = {
                "source": "admission",
                "learned": params.to_json(),
                "burn_rates": burn,
                "decode_instances": self.learner.decode_instances,
                "gateway_offered_rps": rates,
                "gateway_shares": shares,
            }
            digest = fingerprint(policy)
            due = [g.id for g in gateways if self._due(g.id, digest, shares[g.id], now_s)]
            for target in due:
                await self._issue(session, target, self._share(policy, rates, shares, target),
                                  evidence, now)  # fmt: skip
        for target in due:
            self._sent[target] = (digest, shares[target], now_s)
        self.last_policy = policy
        self.last_shares = shares
        return len(due)

    @staticmethod
    def _share(
        policy: AdmissionPolicy,
        rates: dict[str, float | None],
        shares: dict[str, float],
        target: str,
    ) -> AdmissionPolicy:
        """``policy`` with ``target``'s share. A gateway that reports no offered rate
        predates the share (its contract would refuse the unknown field): it gets the
        policy without one, as before, and admits as if alone."""
        if rates[target] is None:
            return policy
        return dataclasses.replace(policy, share_ratio=shares[target])

    def _due(self, target: str, digest: str, share: float, now_s: float) -> bool:
        """A gateway needs the policy when it changed since the last one it was sent (its
        share by more than :data:`SHARE_RESEND_RATIO` of it), or when that one is half-way
        through its TTL (so it never lapses while we run)."""
        sent = self._sent.get(target)
        if sent is None or sent[0] != digest or now_s - sent[2] >= self.config.ttl_s / 2:
            return True
        return abs(share - sent[1]) > SHARE_RESEND_RATIO * sent[1]

    async def _issue(
        self,
        session: AsyncSession,
        target: str,
        policy: AdmissionPolicy,
        evidence: dict[str, Any],
        now: datetime,
    ) -> None:
        await issue_automatic(
            session,
            target=target,
            kind=_KIND,
            payload={"policy": policy},
            version=policy.version,
            evidence=evidence,
            actor=ACTOR,
            now=now,
            ttl_s=self.config.ttl_s,
        )


@asynccontextmanager
async def admission_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Run the admission loop on ``app.state.admission`` when ``settings.admission_enabled``
    (:func:`controlplane.runtime.loop.loop_lifespan`)."""
    settings: Settings = app.state.settings
    async with loop_lifespan(app, AdmissionRuntime, enabled=settings.admission_enabled):
        yield
