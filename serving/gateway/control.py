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
knew, so serving goes on while the control plane is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client import CollectorRegistry

from exporters.sinks import InMemorySink, RecordSink

if TYPE_CHECKING:
    from serving.gateway.config import GatewayConfig
    from serving.gateway.service import Gateway

__all__ = ["ControlPlaneLink", "records_sink"]

logger = logging.getLogger(__name__)

FLEET_PAGE = 500


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
        next_fleet = next_beat = loop.time()
        while not self._stop.is_set():
            now = loop.time()
            if now >= next_fleet:
                await self.sync_fleet()
                next_fleet = now + self.config.fleet_refresh_s
            if now >= next_beat and self.config.agent_key:
                await self.beat()
                next_beat = now + self.config.heartbeat_s
            wait = min(next_fleet, next_beat if self.config.agent_key else next_fleet) - loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=max(0.05, wait))

    async def sync_fleet(self) -> bool:
        """One fleet read into the pool; ``False`` (counted, pool unchanged) on failure."""
        key = self.config.viewer_key or self.config.agent_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        members: list[dict[str, Any]] = []
        try:
            while True:
                response = await self._client.get(
                    "/api/v1/fleet",
                    params={"kind": "worker", "limit": FLEET_PAGE, "offset": len(members)},
                    headers=headers,
                )
                response.raise_for_status()
                page = response.json()
                members.extend(page["data"])
                if not page["data"] or len(members) >= int(page["count"]):
                    break
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
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
        load = {"in_flight": self.gateway.in_flight}
        try:
            if self._registered:
                response = await self._client.post(
                    f"/api/v1/fleet/{config.gateway_id}/heartbeat",
                    json={"state": "ready", "load": load},
                    headers=headers,
                )
                if response.status_code == 404:
                    self._registered = False
            if not self._registered:
                response = await self._client.post(
                    "/api/v1/fleet/register",
                    json={
                        "id": config.gateway_id,
                        "kind": "gateway",
                        "endpoint": f"http://{config.host}:{config.port}",
                        "role": "both",
                        "state": "ready",
                        "load": load,
                    },
                    headers=headers,
                )
            response.raise_for_status()
        except httpx.HTTPError as exc:
            self._registered = False
            self._failed("beat", f"registering the gateway failed ({exc!r}); retrying")
            return False
        self._registered = True
        self._recovered("beat", "gateway registered with the control plane")
        return True

    def _failed(self, what: str, message: str) -> None:
        if what not in self._failing:  # de-duplicated until it recovers
            self._failing.add(what)
            logger.warning(message)

    def _recovered(self, what: str, message: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            logger.warning(message)
