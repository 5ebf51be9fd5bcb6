"""``goodput demo --engine vllm``: the whole stack and its control loops, live, in one command.

It builds the tiny model if it is missing, migrates a SQLite database under ``--dir``, mints
ingest, agent, viewer and operator keys, applies the demo SLO
(``examples/demo-loop-slo.yaml`` with its selector's model set to the served model), then
starts, each as a child process in its own session:

1. the control plane (``goodput controlplane serve``), its admission and planner loops
   ticking every 2 s (:data:`CONTROL_SETTINGS`);
2. one prefill and two decode workers (``goodput worker``: supervised vLLM, prefill alone on
   core 0, both decode workers on core 1; whole prompts per step; one shared KV folder; the
   engine-side exporter and the fleet agent) — or, with ``--engine sim``, H100 sim workers;
3. two PD gateways in front of them, both shipping records to the control plane:
   ``demo-open`` takes no commands (a stack without the loops) and ``demo-gateway``
   registers and applies the admission policies the control plane pushes;

waits until all answer, then runs :mod:`goodput.demo_scenario` (overload without control,
then with it, each action printed, a comparison at the end). ``--duration`` sets the
scenario's length (a third without control, two thirds with it; default 180 s). Ctrl-C
(SIGINT) or SIGTERM stops it early. Either way it stops what it started, in reverse order:
the client (in-flight requests cancelled), the gateways, the workers (each stops its vLLM
server), the control plane — SIGTERM, then SIGKILL to each process group. See
``docs/demo.md``.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from goodput._demo_processes import ChildProcess, DemoError, pick_port, run_cli, signals_set
from goodput.demo_prometheus import demo_monitoring

__all__ = ["CONTROL_SETTINGS", "SERVED_MODEL", "StackOptions", "run_demo_stack"]

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SLO_FILE = REPO_ROOT / "examples" / "demo-loop-slo.yaml"
SERVED_MODEL = "tiny-llama"
# --engine sim: H100 Llama-3.1-8B sim workers (docs/sim-worker.md); no model to build.
SIM_PROFILE = "h100-llama3.1-8b"
SIM_SERVED_MODEL = "llama-3.1-8b"
READY_TIMEOUT_S = 600.0  # three vLLM instances starting at once on a busy 2-core machine
DEFAULT_DURATION_S = 180.0
# The loops at demo speed: a policy and a planner tick every 2 s, a worker may move again
# after 20 s, the effect of a move is read 20 s after it.
CONTROL_SETTINGS = {
    "GOODPUT_ADMISSION_INTERVAL_S": "2",
    "GOODPUT_ADMISSION_POLICY_TTL_S": "30",
    "GOODPUT_PLANNER_INTERVAL_S": "2",
    "GOODPUT_PLANNER_MIN_DWELL_S": "20",
    "GOODPUT_PLANNER_OBSERVE_AFTER_S": "20",
    "GOODPUT_PLANNER_DRAIN_TIMEOUT_S": "30",
}
# Long prompts, short outputs: prefill is the bottleneck. The tiny model holds 2,048
# positions; on the H100 sim, longer prompts keep the request rate (and the client's CPU
# on this 2-core machine) low.
VLLM_PROMPT_TOKENS = (1000, 1600)
SIM_PROMPT_TOKENS = (6000, 10000)
# (role, core): prefill alone on core 0, so moving a decode worker to prefill adds a core.
WORKERS = (("prefill", 0), ("decode", 1), ("decode", 1))

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class StackOptions:
    """What ``goodput demo --engine vllm|sim`` runs."""

    directory: Path = Path("var/demo-vllm")
    duration_s: float | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    overload: float = 2.5
    interval_s: float = 5.0
    window: str = "10s"
    slo_file: Path = DEFAULT_SLO_FILE
    engine: str = "vllm"  # or "sim": sim workers instead of vLLM

    @property
    def served_model(self) -> str:
        return SIM_SERVED_MODEL if self.engine == "sim" else SERVED_MODEL


def run_demo_stack(options: StackOptions, out: IO[str] | None = None) -> int:
    """Run the stack demo from the main thread; 0 when it ran and stopped cleanly."""
    stream = out or sys.stdout
    stop = threading.Event()

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    with signals_set(stop):
        children: list[ChildProcess] = []
        try:
            return _run(options, stop, say, children)
        except DemoError as exc:
            if stop.is_set():
                say("goodput demo: stopped before the scenario started")
                return 0
            say(f"goodput demo: {exc}")
            return 1
        finally:
            for child in reversed(children):  # gateways, workers, control plane
                child.stop(timeout_s=30.0)
            if children:
                say("goodput demo: stopped every process it started")


@dataclass(frozen=True, slots=True)
class _Keys:
    ingest: str
    agent: str
    viewer: str
    operator: str


def _prepare(options: StackOptions, directory: Path, env: dict[str, str], say: Say) -> str:
    """Migrate, apply the SLO; its name."""
    import yaml

    run_cli(env, "db", "upgrade")
    try:
        slo = yaml.safe_load(options.slo_file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise DemoError(f"cannot read the SLO file {options.slo_file}: {exc}") from None
    slo.setdefault("selector", {})["model"] = options.served_model
    slo_path = directory / "demo-slo.yaml"
    slo_path.write_text(yaml.safe_dump(slo, sort_keys=False), encoding="utf-8")
    applied = run_cli(env, "slo", "apply", "-f", str(slo_path)).split()
    if len(applied) < 2:
        raise DemoError(f"`goodput slo apply` printed no SLO for {slo_path}")
    say(f"goodput demo: SLO {applied[1]} applied for model {options.served_model} ({slo_path})")
    return applied[1]


def _run(
    options: StackOptions, stop: threading.Event, say: Say, children: list[ChildProcess]
) -> int:
    from serving.model import default_model_dir

    directory = options.directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    # Always an empty database: each run mints new keys, and the fleet ids a previous run's
    # agent keys registered stay bound to those keys (a second run's gateway was refused),
    # its members would linger in the registry, and its goodput would blur the comparison.
    # Prometheus's and Alertmanager's data go too: the last run's counters, scraped from the
    # same control-plane address, fired the burn-rate alert from old errors.
    for path in [*directory.glob("goodput.db*"), directory / "monitoring"]:
        if path.exists():  # the database, its WAL and ingest log, the monitoring data
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    sim = options.engine == "sim"
    engines = f"{SIM_PROFILE} sim" if sim else "vLLM"
    say(f"goodput demo: the full stack (control plane, {engines} prefill + 2 decode, PD "
        "gateways) and its control loops")  # fmt: skip
    env = {**os.environ, "GOODPUT_DATABASE_URL": f"sqlite:///{directory / 'goodput.db'}"}
    model_dir = default_model_dir()
    if not sim:  # in a child process; returns at once when the model is there
        run_cli(env, "model", "build-tiny", str(model_dir), timeout_s=600.0)
    slo_name = _prepare(options, directory, env, say)

    def key(role: str) -> str:
        return run_cli(env, "admin", "create-key", "--role", role, "--name", f"demo-{role}").strip()

    keys = _Keys(key("ingest"), key("agent"), key("viewer"), key("operator"))
    if stop.is_set():
        return 0
    host = options.host
    cp_port = pick_port(host, options.port)
    cp_url = f"http://{host}:{cp_port}"
    kv_dir = directory / "kv"
    shutil.rmtree(kv_dir, ignore_errors=True)  # KV of an earlier run is never read again
    kv_dir.mkdir()
    python = [sys.executable, "-m", "goodput"]

    def start(name: str, argv: list[str], child_env: dict[str, str] = env) -> ChildProcess:
        child = ChildProcess([*python, *argv], child_env, directory / f"{name}.log")
        children.append(child)
        return child

    control_plane = start(
        "controlplane",
        ["controlplane", "serve", "--no-migrate", "--host", host, "--port", str(cp_port)],
        {**env, **CONTROL_SETTINGS},
    )
    common = ["--host", host, "--kv-dir", str(kv_dir), "--control-plane", cp_url,
              "--agent-key", keys.agent, "--ingest-key", keys.ingest,
              "--heartbeat-interval-s", "1"]  # fmt: skip
    workers: list[tuple[str, str, ChildProcess]] = []
    for index, (role, core) in enumerate(WORKERS):
        port = pick_port(host, 0)
        name = f"worker-{index}-{role}"
        if sim:
            engine = ["--engine", "sim", "--profile", SIM_PROFILE, "--seed", str(index),
                      "--served-model-name", SIM_SERVED_MODEL]  # fmt: skip
        else:
            # Whole prompts per step: a prompt split across steps is not published to the
            # KV folder, and its decode worker computes it again in a step of its running
            # decodes (docs/demo.md).
            engine = ["--model", str(model_dir), "--cpu", str(core), "--served-model-name",
                      SERVED_MODEL, "--run-dir", str(directory / f"{name}-run"),
                      "--nice", "10", "--sched-idle", "--no-chunked-prefill"]  # fmt: skip
        child = start(name, ["worker", "--port", str(port), "--role", role, *common, *engine])
        workers.append((role, f"http://{host}:{port}", child))
    statics = [a for role, url, _ in workers for a in (f"--{role}", url)]
    gateways: dict[str, tuple[str, ChildProcess]] = {}
    for gateway_id, agent in (("demo-open", False), ("demo-gateway", True)):
        port = pick_port(host, 0)
        commands = ["--agent-key", keys.agent, "--command-poll", "0.5"] if agent else []
        gateways[gateway_id] = (f"http://{host}:{port}", start(gateway_id, [
            "gateway", "--host", host, "--port", str(port), *statics,
            "--control-plane", cp_url, "--ingest-key", keys.ingest, *commands,
            "--viewer-key", keys.viewer, "--gateway-id", gateway_id, "--fleet-refresh", "1",
            "--log-level", "WARNING",
        ]))  # fmt: skip
    say(f"goodput demo: logs in {directory} (controlplane, worker-*, demo-open, "
        "demo-gateway .log)")  # fmt: skip
    waits = [(f"{cp_url}/ready", control_plane, "the control plane", 60.0)]
    waits += [(f"{url}/health", child, f"the {role} worker at {url}", READY_TIMEOUT_S)
              for role, url, child in workers]  # fmt: skip
    waits += [(f"{url}/health", child, f"gateway {gid}", 60.0)
              for gid, (url, child) in gateways.items()]  # fmt: skip
    for url, child, what, timeout_s in waits:
        say(f"goodput demo: waiting for {what}")
        child.wait_http(url, what, stop=stop, timeout_s=timeout_s, every_s=0.5)
    if stop.is_set():
        return 0
    _wait_registered(cp_url, keys.viewer, len(workers), stop)
    watch = f"{cp_url}/api/v1/slos/{slo_name}/goodput?window=1m"
    for line in (
        f"goodput demo: control plane at {cp_url}; gateways demo-open "
        f"{gateways['demo-open'][0]} and demo-gateway {gateways['demo-gateway'][0]}",
        "",
        f"Console: {cp_url}/console/",
        *_sign_in_links(cp_url, {"viewer": keys.viewer, "operator": keys.operator}),
        f"Live goodput: {watch}",
        f"  curl -s -H 'Authorization: Bearer {keys.viewer}' '{watch}'",
        f"  control actions: curl -s -H 'Authorization: Bearer {keys.viewer}' "
        f"{cp_url}/api/v1/automation/moves",
        f"  gateway metrics: curl -s {gateways['demo-gateway'][0]}/metrics",
        "Ctrl-C stops it.",
    ):
        say(line)
    scraped = {"controlplane": cp_url, **{gid: url for gid, (url, _) in gateways.items()}}
    scraped.update((f"worker-{i}", url) for i, (_, url, _) in enumerate(workers))
    with demo_monitoring(
        directory / "monitoring", control_plane_url=cp_url, viewer_key=keys.viewer,
        targets={job: url.removeprefix("http://") for job, url in scraped.items()}, say=say,
    ):  # fmt: skip
        return _scenario(options, slo_name, cp_url, keys=keys, gateways=gateways,
                         children=children, stop=stop, say=say)  # fmt: skip


def _sign_in_links(cp_url: str, keys: dict[str, str]) -> list[str]:
    import httpx

    from goodput.demo_console import sign_in_links

    with httpx.Client(base_url=cp_url, timeout=5.0) as client:
        return sign_in_links(client, keys)


def _wait_registered(cp_url: str, viewer_key: str, count: int, stop: threading.Event) -> None:
    """Until ``count`` workers are ready in the fleet registry (agents register after
    their engine answers)."""
    import time

    import httpx

    deadline = time.monotonic() + 60.0
    while not stop.is_set():
        try:
            members = httpx.get(f"{cp_url}/api/v1/fleet", params={"kind": "worker"},
                                headers={"Authorization": f"Bearer {viewer_key}"},
                                timeout=5.0).json()["data"]  # fmt: skip
            if sum(m["state"] == "ready" for m in members) >= count:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise DemoError(f"fewer than {count} workers registered with the control plane")
        stop.wait(0.5)


def _scenario(options: StackOptions, slo_name: str, cp_url: str, *, keys: _Keys,
              gateways: dict[str, tuple[str, ChildProcess]], children: list[ChildProcess],
              stop: threading.Event, say: Say) -> int:  # fmt: skip
    import httpx

    from goodput.demo_scenario import ScenarioOptions, ScenarioStack, run_scenario

    def alive() -> str | None:
        dead = next((c for c in children if not c.alive()), None)
        if dead is None:
            return None
        return f"a process exited (log {dead.log_path}):\n{dead.log_tail()}"

    total = options.duration_s or DEFAULT_DURATION_S
    scenario = ScenarioOptions(
        slo=slo_name, model=options.served_model, overload=options.overload,
        prompt_tokens=SIM_PROMPT_TOKENS if options.engine == "sim" else VLLM_PROMPT_TOKENS,
        open_s=total / 3, control_s=total * 2 / 3, interval_s=options.interval_s,
        window=options.window, fit_slo=options.slo_file == DEFAULT_SLO_FILE,
    )  # fmt: skip
    stack = ScenarioStack(
        cp_url=cp_url, viewer_key=keys.viewer, operator_key=keys.operator,
        open_gateway=gateways["demo-open"][0], control_gateway=gateways["demo-gateway"][0],
        control_gateway_id="demo-gateway", alive=alive,
    )  # fmt: skip
    try:
        run_scenario(stack, scenario, stop, say)
    except (RuntimeError, httpx.HTTPError) as exc:
        raise DemoError(f"the scenario stopped: {exc}") from None
    return 0
