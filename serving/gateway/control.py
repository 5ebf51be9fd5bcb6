"""The gateway and the control plane: records out, fleet membership in, liveness.

:func:`records_sink` is where the gateway's records go: the control plane's ingest through
:class:`~exporters.transport.ControlPlaneExporter` (batched, buffered while the control
plane is away, retried, counted), or nowhere but the gateway's own ``/metrics`` when no
control plane is configured.

:class:`ControlPlaneLink` is one asyncio task started by the app's lifespan. Every
``fleet_refresh_s`` it reads ``GET /api/v1/fleet?kind=worker`` (with the viewer key) into
the pool; every ``heartbeat_s`` it registers the gateway (``POST /api/v1/fleet/register``,
agent key) or beats (``POST /api/v1/fleet/{id}/heartbeat``; a 404 means the control plane
forgot the gateway, so it registers again). Every call has a timeout; a failure is counted
and logged once until the control plane answers again, and the pool keeps what it last
knew, so serving goes on while the control plane is down. A heartbeat's load carries
``in_flight`` and, with an admission hook that counts them, ``offered_rps`` (requests/s
offered to this gateway): the control plane splits the admission budget between the
gateways in proportion to it (docs/scale-out.md). With ``pools_from=kubernetes``
the fleet sync is off (the pods' labels are the membership:
:mod:`serving.gateway.kubernetes`); registration, heartbeats and commands go on.

The messages are the fleet contract's (:mod:`exporters.fleet`: ``FleetPage``,
``FleetRegister``, ``FleetHeartbeat``). With the agent key it also polls its commands every
``command_poll_s`` (:func:`exporters.commands.pending_commands_from_json`) and acknowledges
each delivery (``exporters.commands.CommandAck``). It applies
``set_admission_policy`` to the admission hook (:meth:`PolicyAdmission.apply
<serving.gateway.admission_policy.PolicyAdmission.apply>`); the rules of the contract hold:
an id is applied at most once (a redelivery gets the first answer again), a command for
another target, of another kind, past its expiry or older than the policy applied is
refused (``ok=false`` with the reason). While the control plane is away the hook keeps the
last policy for its TTL, then falls back to its concurrency cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client import CollectorRegistry

from exporters.commands import (
    MAX_DETAIL_CHARS,
    Command,
    CommandAck,
    CommandError,
    CommandKind,
    pending_commands_from_json,
)
from exporters.fleet import (
    FLEET_PATH,
    OFFERED_RPS,
    FleetHeartbeat,
    FleetKind,
    FleetMember,
    FleetPage,
    FleetRegister,
    FleetState,
    PoolRole,
)
from exporters.sinks import InMemorySink, RecordSink

if TYPE_CHECKING:
    from serving.gateway.config import GatewayConfig
    from serving.gateway.state import Gateway

__all__ = ["ControlPlaneLink", "records_sink"]

logger = logging.getLogger(__name__)

FLEET_PAGE = 500
MAX_REMEMBERED_IDS = 4096  # command ids whose answer is kept for redeliveries


class _Discard(InMemorySink):
    """Keeps nothing: the sink when no control plane is configured."""

    def export(self, record: Any) -> None:
        return


def records_sink(config: GatewayConfig, registry: CollectorRegistry) -> RecordSink:
    """The control-plane exporter for ``config`` (its counters on ``registry``), or a sink
    that keeps nothing when there is no control plane."""
    if not config.control_plane:
        return _Discard()
    from exporters.transport import ControlPlaneExporter

    return ControlPlaneExporter(
        config.control_plane,
        api_key=config.ingest_key,
        exporter_id=config.gateway_id,
        flush_interval_s=config.record_flush_interval_s,
        registry=registry,
    )


class ControlPlaneLink:
    """Fleet sync and gateway registration (see the module docstring)."""

    def __init__(self, gateway: Gateway, *, transport: httpx.AsyncBaseTransport | None = None):
        config = gateway.config
        assert config.control_plane is not None
        self.gateway = gateway
        self.config = config
        timeout = httpx.Timeout(5.0, connect=config.connect_timeout_s)
        self._client = httpx.AsyncClient(
            base_url=config.control_plane.rstrip("/"), timeout=timeout, transport=transport
        )
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._registered = False
        self._failing: set[str] = set()
        self.num_fleet_syncs = 0
        self._answers: OrderedDict[str, tuple[bool, str]] = OrderedDict()
        self.num_commands_applied = 0
        self.num_commands_refused = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="goodput-gateway-control-plane")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.aclose()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        never = math.inf
        sync = self.config.fleet_sync
        agent = bool(self.config.agent_key)
        next_fleet = loop.time() if sync else never
        next_beat = next_poll = loop.time() if agent else never
        while not self._stop.is_set():
            now = loop.time()
            if now >= next_fleet:
                await self.sync_fleet()
                next_fleet = now + self.config.fleet_refresh_s
            if now >= next_beat:
                await self.beat()
                next_beat = now + self.config.heartbeat_s
            if now >= next_poll and self._registered:
                await self.poll_commands()
                next_poll = now + self.config.command_poll_s
            due = min(next_fleet, next_beat, next_poll)
            if due == never:  # nothing to do: neither fleet sync nor agent key
                await self._stop.wait()
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=max(0.05, due - loop.time()))

    async def sync_fleet(self) -> bool:
        """One fleet read into the pool; ``False`` (counted, pool unchanged) on failure."""
        key = self.config.viewer_key or self.config.agent_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        members: list[FleetMember] = []
        offset = 0
        try:
            while True:
                response = await self._client.get(
                    FLEET_PATH,
                    params={"kind": "worker", "limit": FLEET_PAGE, "offset": offset},
                    headers=headers,
                )
                response.raise_for_status()
                page = FleetPage.from_json(response.json())
                for error in page.invalid:
                    logger.warning("ignoring a fleet member that breaks the contract: %s", error)
                members.extend(page.data)
                offset += page.size
                if not page.size or offset >= page.count:
                    break
        except (httpx.HTTPError, ValueError) as exc:  # FleetError is a ValueError
            self.gateway.metrics.fleet_failures.inc()
            self._failed(
                "fleet",
                f"reading the fleet registry failed ({exc!r}); keeping the "
                f"{len(self.gateway.pool)} instances last known",
            )
            return False
        self._recovered("fleet", "fleet registry readable again")
        self.gateway.pool.apply_fleet(members)
        self.num_fleet_syncs += 1
        return True

    async def beat(self) -> bool:
        """Register the gateway, or beat when registered; ``False`` on failure."""
        config = self.config
        headers = {"Authorization": f"Bearer {config.agent_key}"}
        load: dict[str, int | float] = {"in_flight": self.gateway.in_flight}
        offered = getattr(self.gateway.admission, "offered_rps", None)
        if offered is not None:  # the weight of this gateway's admission share
            load[OFFERED_RPS] = round(float(offered()), 4)
        try:
            if self._registered:
                response = await self._client.post(
                    f"{FLEET_PATH}/{config.gateway_id}/heartbeat",
                    json=FleetHeartbeat(state=FleetState.READY, load=load).to_json(),
                    headers=headers,
                )
                if response.status_code == 404:
                    self._registered = False
            if not self._registered:
                register = FleetRegister(
                    id=config.gateway_id,
                    kind=FleetKind.GATEWAY,
                    endpoint=f"http://{config.host}:{config.port}",
                    role=PoolRole.BOTH,
                    state=FleetState.READY,
                    load=load,
                    tenant=config.fleet_tenant,
                )
                response = await self._client.post(
                    f"{FLEET_PATH}/register", json=register.to_json(), headers=headers
                )
            response.raise_for_status()
        except httpx.HTTPError as exc:
            self._registered = False
            self._failed("beat", f"registering the gateway failed ({exc!r}); retrying")
            return False
        self._registered = True
        self._recovered("beat", "gateway registered with the control plane")
        return True

    async def poll_commands(self) -> int:
        """Fetch the gateway's due commands, apply and acknowledge each; the number
        handled (0 on failure, counted and logged once)."""
        config = self.config
        headers = {"Authorization": f"Bearer {config.agent_key}"}
        path = f"{FLEET_PATH}/{config.gateway_id}/commands"
        try:
            response = await self._client.get(path, headers=headers)
            response.raise_for_status()
            commands, malformed = pending_commands_from_json(response.json())
        except (httpx.HTTPError, ValueError) as exc:  # CommandError is a ValueError
            self._failed("commands", f"polling commands failed ({exc!r}); retrying")
            return 0
        self._recovered("commands", "polling commands works again")
        for error in malformed:  # without a valid id there is nothing to acknowledge
            logger.warning("ignoring a command that breaks the contract: %s", error)
        handled = 0
        for command in commands:
            ack = self.handle(command)
            try:
                answer = await self._client.post(
                    f"{path}/{command.id}/ack", json=ack.to_json(), headers=headers
                )
                answer.raise_for_status()
            except httpx.HTTPError as exc:  # redelivered later; the answer is remembered
                self._failed("ack", f"acknowledging command {command.id} failed ({exc!r})")
                continue
            self._recovered("ack", "command acknowledgements work again")
            handled += 1
        return handled

    def handle(self, command: Command) -> CommandAck:
        """Apply ``command`` once (see the module docstring); the acknowledgement."""
        known = self._answers.get(command.id)
        if known is None:
            known = self._apply(command)
            self._answers[command.id] = known
            while len(self._answers) > MAX_REMEMBERED_IDS:
                self._answers.popitem(last=False)
            if known[0]:
                self.num_commands_applied += 1
            else:
                self.num_commands_refused += 1
                logger.warning(
                    "command %s (%s) not applied: %s", command.id, command.kind, known[1]
                )
        else:
            self._answers.move_to_end(command.id)
        ok, detail = known
        return CommandAck(command.id, self.config.gateway_id, ok, detail[:MAX_DETAIL_CHARS],
                          time.time_ns())  # fmt: skip

    def _apply(self, command: Command) -> tuple[bool, str]:
        me = self.config.gateway_id
        if command.target != me:
            return False, f"wrong target {command.target!r}: this gateway is {me!r}"
        if command.kind is not CommandKind.SET_ADMISSION_POLICY:
            return False, (
                f"kind {command.kind.value!r} is not supported by this gateway; "
                f"allowed: [{CommandKind.SET_ADMISSION_POLICY.value!r}]"
            )
        if command.expired(time.time_ns()):
            return False, "expired"
        apply = getattr(self.gateway.admission, "apply", None)
        if apply is None:
            hook = type(self.gateway.admission).__name__
            return False, f"this gateway's admission hook ({hook}) takes no policy"
        try:
            return True, str(apply(command.admission_policy()))
        except (CommandError, ValueError) as exc:
            return False, str(exc)

    def _failed(self, what: str, message: str) -> None:
        if what not in self._failing:  # de-duplicated until it recovers
            self._failing.add(what)
            logger.warning(message)

    def _recovered(self, what: str, message: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            logger.warning(message)
