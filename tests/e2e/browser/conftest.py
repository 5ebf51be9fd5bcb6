"""The console in a real browser (Debian's Chromium driven by Playwright), against a real
control plane on PostgreSQL fed by the real exporter, with a real fleet agent.

:func:`console_stack` (module scope) migrates a PostgreSQL schema of its own, mints a key
per role, starts ``goodput controlplane serve`` on it and one sim worker whose agent
registers it and acks commands. :func:`exporter` ships request records through
:class:`~exporters.transport.ControlPlaneExporter`. ``page`` (pytest-playwright) opens
pages at 1440×900 on ``/usr/bin/chromium``; :func:`signed_in` signs a page in with a
role's key through the sign-in form. Screenshots land in ``test-artifacts/console/``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from exporters.recorder import RequestRecorder
from exporters.records import Labels, Status, Vantage
from exporters.transport import ControlPlaneExporter
from goodput._demo_processes import ChildProcess, pick_port, run_cli
from tests.e2e.stack_client import StackClient
from tests.integration.controlplane.conftest import create_schema, drop_schema, schema_url

pytest.importorskip("playwright", reason="the browser tier needs the dev extra (playwright)")

CHROMIUM = "/usr/bin/chromium"
HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "test-artifacts" / "console"
AXE = ROOT / "controlplane" / "console" / "node_modules" / "axe-core" / "axe.min.js"
ROLES = ("admin", "operator", "viewer", "ingest", "agent")

# The marks of the tier: a conftest's own ``pytestmark`` marks nothing, so the test modules
# set theirs to this.
BROWSER_TIER = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]


@dataclass
class ConsoleStack(StackClient):
    cp_url: str
    keys: dict[str, str]
    worker_id: str
    children: list[ChildProcess] = field(default_factory=list)


@pytest.fixture(scope="module")
def console_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleStack]:
    directory = tmp_path_factory.mktemp("console")
    schema = create_schema()
    env = {**os.environ, "GOODPUT_DATABASE_URL": schema_url(schema)}
    children: list[ChildProcess] = []
    try:
        run_cli(env, "db", "upgrade")
        create = ("admin", "create-key", "--role")
        keys = {r: run_cli(env, *create, r, "--name", f"e2e-{r}").strip() for r in ROLES}
        python = [sys.executable, "-m", "goodput"]
        cp_url = f"http://{HOST}:{pick_port(HOST, 0)}"
        serve = ["controlplane", "serve", "--no-migrate", "--host", HOST]
        cp_env = {**env, "GOODPUT_PLANNER_ENABLED": "false"}
        port = cp_url.rsplit(":", 1)[1]
        cp = ChildProcess([*python, *serve, "--port", port], cp_env, directory / "cp.log")
        children.append(cp)
        cp.wait_http(f"{cp_url}/ready", f"{cp_url}/ready", timeout_s=90.0)
        port = pick_port(HOST, 0)
        worker = ChildProcess([*python,
            "worker", "--engine", "sim", "--profile", "h100-llama3.1-8b", "--role", "decode",
            "--host", HOST, "--port", str(port), "--kv-dir", str(directory / "kv"),
            "--control-plane", cp_url, "--agent-key", keys["agent"],
            "--heartbeat-interval-s", "1",
        ], env, directory / "worker.log")  # fmt: skip
        children.append(worker)
        worker.wait_http(f"http://{HOST}:{port}/health", "worker", timeout_s=90.0)
        yield ConsoleStack(cp_url, keys, f"{HOST}:{port}", children)
    finally:
        for child in reversed(children):
            child.stop(timeout_s=15.0)
        drop_schema(schema)


@pytest.fixture(scope="module")
def exporter(console_stack: ConsoleStack) -> Iterator[Callable[..., None]]:
    """``send(n, model=..., tenant=..., ok=True, vantage=GATEWAY, priority="",
    rejected=False)``: n requests through the real exporter (a rejected one has no token)."""
    transport = ControlPlaneExporter(
        console_stack.cp_url, api_key=console_stack.keys["ingest"], flush_interval_s=0.05
    )
    recorders = {v: RequestRecorder(v, transport) for v in Vantage}
    counter = iter(range(10**9))

    def send(
        n: int,
        *,
        model: str = "llama",
        tenant: str = "acme",
        ok: bool = True,
        vantage: Vantage = Vantage.GATEWAY,
        priority: str = "",
        rejected: bool = False,
    ) -> None:
        labels = Labels(model=model, tenant=tenant, priority=priority)
        for _ in range(n):
            trace = recorders[vantage].start(f"r{next(counter)}", labels)
            if rejected:
                trace.finish(Status.REJECTED, "shed by admission")
                continue
            trace.token()
            trace.token()
            trace.finish(Status.OK if ok else Status.ERROR, "" if ok else "engine error")
        assert transport.force_flush(timeout_s=10.0)

    yield send
    transport.shutdown(timeout_s=5.0)


@pytest.fixture(scope="session")
def browser_type_launch_args() -> dict[str, Any]:
    return {"executable_path": CHROMIUM, "args": ["--no-sandbox"]}


@pytest.fixture(scope="session")
def browser_context_args() -> dict[str, Any]:
    return {"viewport": {"width": 1440, "height": 900}}


@pytest.fixture(scope="session", autouse=True)
def _artifacts() -> None:
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)


@pytest.fixture
def console_errors(page: Any) -> list[str]:
    """Console errors and uncaught exceptions of ``page`` (asserted empty by tests)."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def sign_in(page: Any, stack: ConsoleStack, role: str) -> None:
    page.goto(f"{stack.cp_url}/console/sign-in")
    page.get_by_label("API key").fill(stack.keys[role])
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{stack.cp_url}/console/")


def shoot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=False)


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page (axe from npm)."""
    page.evaluate(AXE.read_text())  # not a <script> tag: the console's CSP forbids inline ones
    result = page.evaluate("async () => (await axe.run(document)).violations")
    return [v for v in result if v["impact"] in ("serious", "critical")]
