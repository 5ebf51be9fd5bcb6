"""Supervise one vLLM server: start it, watch it, restart it, keep its KV folder bounded.

:class:`WorkerSupervisor` owns a :class:`~serving.workers.launcher.VllmServer` and one
monitor thread that does everything to it (so the server's parent-death signal is tied to a
thread that lives as long as the supervisor). Every ``health_interval_s`` the thread:

* while starting: waits for ``/health`` 200 (state ``starting`` → ``ready``); a server that
  is not ready within ``ready_timeout_s`` is killed and counts as a crash;
* while running: a dead process, or ``unhealthy_after`` failed health checks in a row (a
  hung server, killed), is a crash: state ``down``, incomplete KV folders of the dead writer
  removed, and a restart scheduled after an exponential backoff
  (:class:`~serving.workers.backoff.RestartBackoff`, reset after ``backoff_reset_s`` healthy);
* scrapes ``/metrics`` for the load (running and waiting requests, KV usage) every
  ``load_interval_s``, and collects the shared KV folder's garbage every
  ``kv_gc_interval_s`` under ``kv_policy``.

Commands (through the optional :class:`~serving.workers.agent.Agent`): ``drain`` reports
state ``draining`` and then ``drained`` once no request is running or waiting (the gateway
stops routing to a draining worker; vLLM itself keeps answering what it gets); ``resume``
undoes it; ``set_role`` changes the reported pool (and on Kubernetes the pod's role label
first). The state is also what ``/ready`` answers (:mod:`serving.workers.readiness`: 200
only while ``ready``), so on Kubernetes a draining pod leaves the gateways' pools.
Instances run with ``kv_role`` ``kv_both``, so no command restarts vLLM.

Example::

    worker = WorkerSupervisor(VllmSpec(model=model_dir, port=8100, cpu=0, kv_dir=kv_dir),
                              run_dir=run_dir, role=PoolRole.PREFILL)
    worker.start()
    worker.wait_ready(timeout_s=300)
    ...
    worker.stop()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from exporters.commands import CommandKind
from exporters.fleet import FleetState, PoolRole
from serving.workers.agent import Agent, AgentReport, AgentSettings
from serving.workers.backoff import RestartBackoff
from serving.workers.config import VllmSpec
from serving.workers.kv_folder import GCResult, KVFolder, KVFolderPolicy
from serving.workers.launcher import ServerError, VllmServer
from serving.workers.load import WorkerLoad, parse_load
from serving.workers.relabel import PodRelabeler

__all__ = [
    "ServerHandle",
    "SupervisorSettings",
    "WorkerStatus",
    "WorkerSupervisor",
]

logger = logging.getLogger(__name__)

# A live writer touches its KV files every few milliseconds; one untouched this long after
# its instance died is abandoned.
CRASH_KV_GRACE_S = 1.0


@dataclass(frozen=True, slots=True)
class SupervisorSettings:
    health_interval_s: float = 1.0
    health_timeout_s: float = 2.0
    unhealthy_after: int = 5
    ready_timeout_s: float = 300.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    backoff_reset_s: float = 60.0
    stop_timeout_s: float = 20.0
    load_interval_s: float = 2.0
    kv_gc_interval_s: float = 30.0
    kv_policy: KVFolderPolicy | None = field(default_factory=KVFolderPolicy)

    def __post_init__(self) -> None:
        for name in ("health_interval_s", "health_timeout_s", "ready_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.unhealthy_after < 1:
            raise ValueError(f"unhealthy_after must be >= 1, got {self.unhealthy_after}")


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """A snapshot: ``num_crashes`` counts deaths and hangs, ``num_restarts`` the starts after
    the first; ``pid`` is the current vLLM server's (``None`` while down)."""

    url: str
    role: PoolRole
    state: FleetState
    pid: int | None
    num_restarts: int
    num_crashes: int
    last_exit_code: int | None
    load: WorkerLoad
    kv_gc: GCResult | None


class ServerHandle(Protocol):
    """What the supervisor needs of a server (:class:`VllmServer` is the real one)."""

    @property
    def pid(self) -> int | None: ...
    @property
    def returncode(self) -> int | None: ...
    def start(self) -> None: ...
    def alive(self) -> bool: ...
    def healthy(self, timeout_s: float = 2.0) -> bool: ...
    def kill(self) -> None: ...
    def stop(self, timeout_s: float = 20.0) -> None: ...
    def log_tail(self, num_bytes: int = 4000) -> str: ...


class WorkerSupervisor:
    """One supervised vLLM server; see the module docstring. ``agent`` (optional) registers
    the worker with a control plane, and ``relabeler`` makes its ``set_role`` relabel the
    pod (:mod:`serving.workers.relabel`); ``kv_folder`` defaults to the spec's ``kv_dir``;
    ``server`` replaces the :class:`VllmServer` built from ``spec`` (tests)."""

    def __init__(
        self,
        spec: VllmSpec,
        *,
        run_dir: Path,
        role: PoolRole = PoolRole.BOTH,
        settings: SupervisorSettings | None = None,
        agent: AgentSettings | None = None,
        relabeler: PodRelabeler | None = None,
        kv_folder: KVFolder | None = None,
        server: ServerHandle | None = None,
    ) -> None:
        self.spec = spec
        self.settings = settings or SupervisorSettings()
        self.server: ServerHandle = server or VllmServer(spec, run_dir=run_dir)
        self._http = httpx.Client()  # the load scrapes (a pooled client: see VllmServer)
        if kv_folder is None and spec.kv_dir is not None:
            kv_folder = KVFolder.for_model(spec.kv_dir, spec.model)
        self.kv_folder = kv_folder
        s = self.settings
        self._backoff = RestartBackoff(s.backoff_initial_s, s.backoff_max_s, 2.0, s.backoff_reset_s)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._role = PoolRole(role)
        self._state = FleetState.STARTING
        self._draining = False
        self._load = WorkerLoad()
        self._num_starts = 0
        self._num_crashes = 0
        self._last_exit: int | None = None
        self._kv_gc: GCResult | None = None
        self.agent = (
            None
            if agent is None
            else Agent(agent, report=self.report, apply=self.apply_command, relabeler=relabeler)
        )

    # -- public API --

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def pid(self) -> int | None:
        return self.server.pid if self.server.alive() else None

    def status(self) -> WorkerStatus:
        with self._lock:
            return WorkerStatus(
                url=self.url,
                role=self._role,
                state=self._state,
                pid=self.pid,
                num_restarts=max(0, self._num_starts - 1),
                num_crashes=self._num_crashes,
                last_exit_code=self._last_exit,
                load=self._load,
                kv_gc=self._kv_gc,
            )

    def start(self) -> None:
        """Start the monitor thread (which starts vLLM) and the agent; returns at once."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"goodput-worker-{self.spec.port}", daemon=True
        )
        self._thread.start()
        if self.agent is not None:
            self.agent.start()

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until the server answers ``/health`` (after a start or a restart)."""
        if not self._ready.wait(timeout_s):
            raise ServerError(
                f"worker {self.url} not ready after {timeout_s:g} s (state {self._state}, "
                f"{self._num_crashes} crashes); vLLM log tail:\n{self.server.log_tail()}"
            )

    def kill_engine(self) -> None:
        """SIGKILL the vLLM server (a crash, for tests); the monitor restarts it."""
        with self._lock:
            self._ready.clear()
            self._state = FleetState.DOWN
            self.server.kill()

    def stop(self) -> None:
        """Stop the agent, then the server (SIGTERM, then SIGKILL); idempotent."""
        if self.agent is not None:
            self.agent.stop()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.settings.stop_timeout_s + 15.0)
        self.server.stop(self.settings.stop_timeout_s)  # if the thread could not

    def report(self) -> AgentReport:
        """Role, state and load for the agent's registration and heartbeats."""
        status = self.status()
        load: dict[str, Any] = dict(status.load.as_report())
        load["num_restarts"] = status.num_restarts
        return AgentReport(role=status.role, state=status.state, load=load)

    def apply_command(self, kind: CommandKind, payload: Mapping[str, Any]) -> str:
        """Apply ``drain``, ``resume`` or ``set_role``; the detail for the acknowledgement."""
        with self._lock:
            if kind is CommandKind.DRAIN:
                self._draining = True
                self._refresh_state()
                return f"draining ({self._state})"
            if kind is CommandKind.RESUME:
                self._draining = False
                self._refresh_state()
                return f"resumed ({self._state})"
            if kind is CommandKind.SET_ROLE:
                old, self._role = self._role, PoolRole(payload["role"])
                return f"role {old} -> {self._role} (kv_both: no restart)"
        raise ValueError(f"kind {kind.value!r} is not a worker command")

    # -- the monitor thread --

    def _run(self) -> None:
        try:
            self._monitor()
        except Exception:  # a bug here must not leave vLLM unsupervised: stop it
            logger.exception("worker supervisor for %s failed; stopping vLLM", self.url)
        finally:
            self.server.stop(self.settings.stop_timeout_s)
            with self._lock:
                self._state = FleetState.DOWN
                self._ready.clear()

    def _monitor(self) -> None:
        s = self.settings
        self._collect_kv(incomplete_only=True)
        self._launch()
        started = ready_since = time.monotonic()
        restart_at: float | None = None
        failed_checks = 0
        next_load = next_gc = 0.0
        while not self._stop.wait(s.health_interval_s):
            now = time.monotonic()
            if restart_at is not None:
                if now >= restart_at:
                    self._collect_kv(incomplete_only=True)
                    self._launch()
                    started, restart_at, failed_checks = now, None, 0
                continue
            crashed = None
            if not self.server.alive():
                crashed = f"exited with code {self.server.returncode}"
            elif self.server.healthy(s.health_timeout_s):
                failed_checks = 0
                if not self._ready.is_set():
                    ready_since = now
                    with self._lock:
                        self._ready.set()
                        self._refresh_state()
                    logger.info("vLLM on %s ready after %.1fs", self.url, now - started)
                self._backoff.success(now - ready_since)
            elif not self._ready.is_set():
                if now - started > s.ready_timeout_s:
                    crashed = f"not ready after {s.ready_timeout_s:g}s"
            else:
                failed_checks += 1
                if failed_checks >= s.unhealthy_after:
                    crashed = f"failed {failed_checks} health checks in a row"
            if crashed is not None:
                restart_at = now + self._crashed(crashed)
                continue
            if self._ready.is_set() and now >= next_load:
                self._scrape_load()
                next_load = now + s.load_interval_s
            if now >= next_gc and s.kv_policy is not None:
                self._collect_kv(incomplete_only=False)
                next_gc = now + s.kv_gc_interval_s

    def _launch(self) -> None:
        with self._lock:
            self._state = FleetState.STARTING
            self._ready.clear()
            self.server.start()
            self._num_starts += 1

    def _crashed(self, why: str) -> float:
        with self._lock:
            self.server.kill()  # the engine core too, and a hung server
            self._last_exit = self.server.returncode
            self._num_crashes += 1
            self._state = FleetState.DOWN
            self._ready.clear()
            self._load = WorkerLoad()
        delay = self._backoff.failure()
        logger.error(
            "vLLM on %s %s (crash %d); restarting in %.1fs; log tail:\n%s",
            self.url,
            why,
            self._num_crashes,
            delay,
            self.server.log_tail(1500),
        )
        self._collect_kv(incomplete_only=True)
        return delay

    def _refresh_state(self) -> None:
        """Lock held: the reported state from readiness, drain and load."""
        if not self._ready.is_set():
            return
        if not self._draining:
            self._state = FleetState.READY
        else:
            self._state = FleetState.DRAINED if self._load.idle else FleetState.DRAINING

    def _scrape_load(self) -> None:
        try:
            response = self._http.get(f"{self.url}/metrics", timeout=self.settings.health_timeout_s)
            response.raise_for_status()
            load = parse_load(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            logger.debug("load scrape of %s failed: %s", self.url, exc)
            return
        with self._lock:
            self._load = load
            self._refresh_state()

    def _collect_kv(self, *, incomplete_only: bool) -> None:
        if self.kv_folder is None:
            return
        try:
            if incomplete_only:
                result = self.kv_folder.remove_incomplete(CRASH_KV_GRACE_S)
            else:
                assert self.settings.kv_policy is not None
                result = self.kv_folder.collect(self.settings.kv_policy)
        except OSError as exc:  # a shared folder gone or unreadable: serving goes on
            logger.warning("KV folder %s: garbage collection failed: %s", self.kv_folder.root, exc)
            return
        with self._lock:
            self._kv_gc = result
