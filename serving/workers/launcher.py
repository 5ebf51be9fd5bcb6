"""Start, watch and stop one vLLM OpenAI server process.

:class:`VllmServer` runs the :class:`~serving.workers.config.LaunchPlan` of a
:class:`~serving.workers.config.VllmSpec` in its own session (process group), with its own
``TMPDIR`` and cache under ``run_dir``, its output appended to ``run_dir/vllm.log``, as a
:class:`~serving.process.ChildProcess`. vLLM's API server forks an engine-core process;
:meth:`VllmServer.stop` and :meth:`VllmServer.kill` end the whole group, so no engine
outlives its server. With ``die_with_parent`` (default) the server also gets SIGTERM when the
*thread* that started it ends (Linux), so a crashed supervisor leaves nothing behind: start
it from a long-lived thread.

Example::

    server = VllmServer(VllmSpec(model=model_dir, port=8100, cpu=0), run_dir=tmp / "w0")
    server.start()
    server.wait_ready(timeout_s=180)
    ...  # POST server.url + "/v1/completions"
    server.stop()
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from serving.process import ChildProcess
from serving.workers.config import LaunchPlan, VllmSpec, build_launch
from serving.workers.priority import lower_priority

__all__ = ["LOG_NAME", "ServerError", "VllmServer"]

logger = logging.getLogger(__name__)

LOG_NAME = "vllm.log"
_LOG_TAIL_BYTES = 4000
# A Unix socket path holds 107 bytes; vLLM names its sockets DIR/<36-character uuid>.
_MAX_RPC_DIR_BYTES = 107 - 1 - 36


class ServerError(RuntimeError):
    """The server exited or did not become ready; the message carries its log's tail."""


class VllmServer:
    """One vLLM server process (not restarted: that is the supervisor's job).

    ``start()`` returns at once; ``wait_ready(timeout_s)`` polls ``GET /health`` until 200,
    raising :class:`ServerError` (with the log's tail) if the process exits first or the time
    runs out. ``alive()``, ``pid`` and ``returncode`` describe the current process.
    ``kill()`` is a crash (SIGKILL to the group); ``stop(timeout_s)`` a clean shutdown
    (SIGTERM, then SIGKILL after the timeout). Both are idempotent. ``start()`` after the
    process ended starts a fresh one with the same spec and folders.
    """

    def __init__(self, spec: VllmSpec, *, run_dir: Path, die_with_parent: bool = True) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.die_with_parent = die_with_parent
        self.log_path = self.run_dir / LOG_NAME
        self._child: ChildProcess | None = None
        # One pooled client for the health checks: a fresh one per check (``httpx.get``)
        # costs ~25 ms of CPU, mostly building a TLS context, on cores the engine needs.
        self._http = httpx.Client()
        self._settled = False  # spec.nice applied to the running process
        self._short_rpc_dir: Path | None = None

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def pid(self) -> int | None:
        return None if self._child is None else self._child.pid

    @property
    def returncode(self) -> int | None:
        return None if self._child is None else self._child.returncode

    def plan(self) -> LaunchPlan:
        parent = os.getpid() if self.die_with_parent else None
        return build_launch(
            self.spec, run_dir=self.run_dir, parent_pid=parent, rpc_dir=self._rpc_dir()
        )

    def _rpc_dir(self) -> Path:
        """Where vLLM puts its ZMQ IPC sockets: ``run_dir/tmp`` when its path leaves room for
        a socket name (a Unix socket path has at most 107 bytes), else a short folder of its
        own under ``/tmp``, made once and removed by :meth:`stop` (a deep ``--run-dir``
        otherwise kills vLLM at start-up: "ipc path ... is longer than 107 characters")."""
        tmp = (self.run_dir / "tmp").resolve()
        if len(str(tmp).encode()) <= _MAX_RPC_DIR_BYTES:
            return tmp
        if self._short_rpc_dir is None:
            base = "/tmp" if os.path.isdir("/tmp") else None
            self._short_rpc_dir = Path(
                tempfile.mkdtemp(prefix=f"goodput-rpc-{self.spec.port}-", dir=base)
            )
        return self._short_rpc_dir

    def start(self) -> None:
        """Start the process (no-op while one is running)."""
        if self.alive():
            return
        if self._child is not None:
            self._child.kill()  # an engine core left over from a crashed server
        self._settled = False
        for sub in ("tmp", "cache"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        plan = self.plan()  # already through the exec wrapper with die_with_parent
        with self.log_path.open("ab") as log:
            log.write(f"\n=== goodput: starting {' '.join(plan.argv)}\n".encode())
        self._child = ChildProcess(
            plan.argv,
            log_path=self.log_path,
            env=plan.env,
            cwd=self.run_dir,
            die_with_parent=False,
        )
        self._child.start()
        logger.info("started vLLM on %s (pid %s), log %s", self.url, self.pid, self.log_path)

    def alive(self) -> bool:
        return self._child is not None and self._child.alive()

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """Whether ``GET /health`` answers 200 now."""
        try:
            ok = self._http.get(f"{self.url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False
        if ok and not self._settled:
            self._settle()
        return ok

    def _settle(self) -> None:
        """Once ready: the whole group to ``spec.nice`` and ``spec.sched_idle`` (start-up
        ran at normal priority, so a busy machine does not stretch it)."""
        self._settled = True
        spec = self.spec
        if (spec.nice or spec.sched_idle) and self.pid is not None:
            try:
                changed = lower_priority(self.pid, spec.nice, sched_idle=spec.sched_idle)
            except OSError as exc:
                logger.warning("could not lower vLLM's priority on %s: %s", self.url, exc)
            else:
                logger.info(
                    "vLLM on %s now runs at niceness %d%s (%d threads)", self.url, spec.nice,
                    ", SCHED_IDLE" if spec.sched_idle else "", changed,
                )  # fmt: skip

    def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.5) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise ServerError(
                    f"vLLM on {self.url} exited with code {self.returncode} before it was "
                    f"ready; log tail:\n{self.log_tail()}"
                )
            if self.healthy():
                return
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"vLLM on {self.url} not ready after {timeout_s:g} s; log tail:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(poll_s)

    def kill(self) -> None:
        """SIGKILL the whole process group (what a crash looks like) and reap the server."""
        if self._child is not None:
            self._child.kill()

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the group, wait up to ``timeout_s``, then SIGKILL what is left."""
        if self._child is not None and not self._child.stop(timeout_s):
            logger.warning("vLLM on %s ignored SIGTERM for %g s; killed it", self.url, timeout_s)
        if self._short_rpc_dir is not None:
            shutil.rmtree(self._short_rpc_dir, ignore_errors=True)
            self._short_rpc_dir = None

    def log_tail(self, num_bytes: int = _LOG_TAIL_BYTES) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - num_bytes))
                return log.read().decode(errors="replace")
        except OSError:
            return "(no log)"
