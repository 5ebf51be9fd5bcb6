"""The worker's agent: registers with the control plane, beats, and runs its commands.

The client side of the fleet contract (:mod:`exporters.fleet`; the key needs role
``agent``):

* :class:`~exporters.fleet.FleetRegister` (``kind`` worker) at start, after the control
  plane forgot us (a heartbeat's 404), and when the role changes (the heartbeat carries no
  role);
* :class:`~exporters.fleet.FleetHeartbeat` every ``heartbeat_interval_s``;
* commands (:mod:`exporters.commands`; on Kubernetes ``set_role`` also relabels the pod,
  :mod:`serving.workers.relabel`): the pending ones for ``member_id``
  (:func:`~exporters.commands.pending_commands_from_json`), each acknowledged with its
  :class:`~exporters.commands.CommandAck`. A 404/405 on the poll means the routes are
  absent: the agent says so once and asks again every ``command_retry_s``.

Failure: every call has a timeout; an unreachable or failing control plane is retried with
capped exponential backoff, logged once when it starts failing and once when it is back.
The agent never raises into the worker: serving goes on without a control plane.

Example::

    agent = Agent(AgentSettings(url="http://cp:8000", key=key, member_id="10.0.0.7:8100",
                                endpoint="http://10.0.0.7:8100", model="tiny"),
                  report=supervisor.report, apply=supervisor.apply_command)
    agent.start()
    ...
    agent.stop()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from exporters.commands import CommandError, pending_commands_from_json
from exporters.fleet import (
    FLEET_PATH,
    FleetHeartbeat,
    FleetKind,
    FleetRegister,
    FleetState,
    LoadValue,
    PoolRole,
)
from serving.workers.backoff import RestartBackoff
from serving.workers.commands import ApplyFn, CommandExecutor
from serving.workers.relabel import PodRelabeler, relabelling

__all__ = ["FLEET_PATH", "Agent", "AgentReport", "AgentSettings", "AgentStats"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Where the control plane is and who this worker is. ``member_id`` is also the target
    name commands use (default in the CLI: ``host:port``). ``tenant``: the tenant whose
    pool the worker serves, sent when it registers (its tenant-scoped keys then see and
    command it); ``None``: the cluster's, shared."""

    url: str
    member_id: str
    endpoint: str
    key: str | None = None
    model: str = ""
    heartbeat_interval_s: float = 5.0
    command_retry_s: float = 60.0
    timeout_s: float = 5.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    tenant: str | None = None

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        for name in ("heartbeat_interval_s", "command_retry_s", "timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class AgentReport:
    """What the worker reports: its pool ``role``, fleet ``state`` and flat ``load``."""

    role: PoolRole
    state: FleetState
    load: dict[str, LoadValue]

    def __post_init__(self) -> None:  # their values are accepted too ("decode", "ready")
        object.__setattr__(self, "role", PoolRole(self.role))
        object.__setattr__(self, "state", FleetState(self.state))


@dataclass(frozen=True, slots=True)
class AgentStats:
    registered: bool
    num_registrations: int
    num_heartbeats: int
    num_failures: int
    num_commands: int
    commands_supported: bool | None  # None: not asked yet


class Agent:
    """Runs :meth:`step` on a daemon thread until :meth:`stop`. ``report`` is called for
    each registration and heartbeat; ``apply(kind, payload)`` runs a command (see
    :class:`~serving.workers.commands.CommandExecutor`). With ``relabeler`` (on Kubernetes),
    ``set_role`` also relabels the worker's pod, and is acknowledged done only once the
    API server took the patch (:mod:`serving.workers.relabel`). ``transport`` replaces
    httpx's network transport (tests)."""

    def __init__(
        self,
        settings: AgentSettings,
        *,
        report: Callable[[], AgentReport],
        apply: ApplyFn,
        relabeler: PodRelabeler | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self._report = report
        self.relabeler = relabeler
        if relabeler is not None:
            apply = relabelling(apply, relabeler)
        self.executor = CommandExecutor(settings.member_id, apply)
        headers = {"Authorization": f"Bearer {settings.key}"} if settings.key else {}
        self._client = httpx.Client(
            base_url=settings.url.rstrip("/"),
            headers=headers,
            timeout=settings.timeout_s,
            transport=transport,
        )
        self._backoff = RestartBackoff(settings.backoff_initial_s, settings.backoff_max_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._registered_role: PoolRole | None = None
        self._failing = False
        self._commands_supported: bool | None = None
        self._next_command_check = 0.0
        self.num_registrations = 0
        self.num_heartbeats = 0
        self.num_failures = 0

    @property
    def member_path(self) -> str:
        return f"{FLEET_PATH}/{self.settings.member_id}"

    def stats(self) -> AgentStats:
        return AgentStats(
            registered=self._registered_role is not None,
            num_registrations=self.num_registrations,
            num_heartbeats=self.num_heartbeats,
            num_failures=self.num_failures,
            num_commands=self.executor.num_applied + self.executor.num_refused,
            commands_supported=self._commands_supported,
        )

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="goodput-agent", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop beating (the control plane marks the member stale after its timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._client.close()
        if self.relabeler is not None:
            self.relabeler.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            delay = self.step()
            self._stop.wait(delay)

    def step(self) -> float:
        """One round: register or beat, then run pending commands. Returns the seconds to
        wait before the next round. Never raises."""
        try:
            report = self._report()
            if not self._register_if_moved(report) and not self._heartbeat(report):
                self._register(self._report())  # forgotten: register again at once
            if self._poll_commands():
                # A set_role just applied: the registry learns the new role now, not a
                # heartbeat interval later.
                self._register_if_moved(self._report())
        except (httpx.HTTPError, _UnavailableError, CommandError) as exc:
            return self._failed(exc)
        except Exception as exc:  # a bug must not stop the agent: log it, retry later
            logger.exception("agent step failed")
            return self._failed(exc)
        if self._failing:
            logger.warning("control plane at %s reachable again", self.settings.url)
            self._failing = False
        self._backoff.success()
        return self.settings.heartbeat_interval_s

    def _register_if_moved(self, report: AgentReport) -> bool:
        """Register ``report`` when its role is not the registered one; whether it did."""
        if report.role == self._registered_role:
            return False
        self._register(report)
        return True

    def _failed(self, exc: Exception) -> float:
        self.num_failures += 1
        delay = min(self._backoff.failure(), self.settings.heartbeat_interval_s * 6)
        if not self._failing:  # de-duplicated: once when failures start
            logger.warning(
                "control plane at %s unavailable (%s: %s); the worker keeps serving, "
                "retrying in %.1fs",
                self.settings.url,
                type(exc).__name__,
                exc,
                delay,
            )
            self._failing = True
        return delay

    def _register(self, report: AgentReport) -> None:
        body = FleetRegister(
            id=self.settings.member_id,
            kind=FleetKind.WORKER,
            endpoint=self.settings.endpoint,
            model=self.settings.model,
            role=report.role,
            state=report.state,
            load=report.load,
            tenant=self.settings.tenant,
        )
        _check(self._client.post(f"{FLEET_PATH}/register", json=body.to_json()), "register")
        self._registered_role = report.role
        self.num_registrations += 1

    def _heartbeat(self, report: AgentReport) -> bool:
        """Beat; ``False`` when the control plane no longer knows this member."""
        body = FleetHeartbeat(state=report.state, load=report.load)
        response = self._client.post(f"{self.member_path}/heartbeat", json=body.to_json())
        if response.status_code == 404:
            self._registered_role = None
            return False
        _check(response, "heartbeat")
        self.num_heartbeats += 1
        return True

    def _poll_commands(self) -> int:
        """Run the pending commands; returns how many were handled."""
        now = time.monotonic()
        if self._commands_supported is False and now < self._next_command_check:
            return 0
        response = self._client.get(f"{self.member_path}/commands")
        if response.status_code in (404, 405):
            if self._commands_supported is not False:
                logger.info(
                    "control plane at %s has no command route (GET %s/commands: HTTP %d); "
                    "asking again every %gs",
                    self.settings.url,
                    self.member_path,
                    response.status_code,
                    self.settings.command_retry_s,
                )
            self._commands_supported = False
            self._next_command_check = now + self.settings.command_retry_s
            return 0
        _check(response, "command poll")
        self._commands_supported = True
        commands, malformed = pending_commands_from_json(response.json())
        for exc in malformed:
            logger.error("ignoring a malformed command from the control plane: %s", exc)
        for command in commands:
            ack = self.executor.handle(command)
            path = f"{self.member_path}/commands/{command.id}/ack"
            _check(self._client.post(path, json=ack.to_json()), "command ack")
        return len(commands)


class _UnavailableError(RuntimeError):
    """The control plane answered with a status that means "try again later"."""


def _check(response: httpx.Response, what: str) -> None:
    if response.is_success:
        return
    detail = response.text[:200]
    if response.status_code >= 500 or response.status_code == 429:
        raise _UnavailableError(f"{what}: HTTP {response.status_code} {detail}")
    # A 4xx other than 404/429 is a bug on one side; retrying will not fix it, but the
    # worker must keep serving, so it is logged (once per failure streak) and retried slowly.
    raise _UnavailableError(f"{what} refused: HTTP {response.status_code} {detail}")
