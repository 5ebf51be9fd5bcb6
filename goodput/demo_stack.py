"""``goodput demo --engine vllm``: the whole stack on this machine, live, in one command.

It builds the tiny model if it is missing, migrates a SQLite database under ``--dir``, mints
an ingest, an agent and a viewer key, applies the demo SLO (``examples/demo-slo.yaml`` with
its selector set to the served model), then starts, each as a child process in its own
session:

1. the control plane (``goodput controlplane serve``);
2. a prefill and a decode worker (``goodput worker``: supervised vLLM on cores 0 and 1,
   one shared KV folder, the engine-side exporter and the fleet agent);
3. the PD gateway (``goodput gateway``) in front of them, shipping its records to the
   control plane;

waits until all answer, prints where to watch live goodput, and replays a slice of the
Azure conversation trace through the gateway with ``goodput bench`` (open loop, at
``--rate-scale`` times the trace's rate, from ten minutes into it: 0.1× ≈ 0.55 requests/s
by default, what two CPU-bound tiny-model instances on this kind of machine keep up with). Every
``--interval`` seconds it prints one line from the goodput API. ``--duration`` bounds the
replay; otherwise Ctrl-C (SIGINT) or SIGTERM stops it. Either way it stops what it
started, in reverse order: the replay (in-flight requests cancelled), the gateway, the
workers (each stops its vLLM server), the control plane — SIGTERM, then SIGKILL to each
process group. See ``docs/gateway.md``.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from goodput._demo_processes import ChildProcess, DemoError, pick_port, run_cli, signals_set
from goodput.demo_prometheus import demo_monitoring

__all__ = ["SERVED_MODEL", "StackOptions", "run_demo_stack"]

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SLO_FILE = REPO_ROOT / "examples" / "demo-slo.yaml"
SERVED_MODEL = "tiny-llama"
# --engine sim: H100 Llama-3.1-8B sim workers (docs/sim-worker.md); no model to build.
SIM_PROFILE = "h100-llama3.1-8b"
SIM_SERVED_MODEL = "llama-3.1-8b"
READY_TIMEOUT_S = 300.0  # two vLLM instances starting at once on a busy 2-core machine
HEADER = "  time   req/s  goodput  attainment    burn  p99 TTFT   p99 ITL  finished  failed"

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class StackOptions:
    """What ``goodput demo --engine vllm`` runs."""

    directory: Path = Path("var/demo-vllm")
    duration_s: float | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    trace: str = "azure_conv"
    rate_scale: float = 0.1
    start_s: float = 600.0  # ten minutes in: the trace's first minutes are sparse
    interval_s: float = 10.0
    window: str = "1m"
    slo_file: Path = DEFAULT_SLO_FILE
    fresh: bool = False
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
                say("goodput demo: stopped before the replay started")
                return 0
            say(f"goodput demo: {exc}")
            return 1
        finally:
            for child in reversed(children):  # gateway, workers, control plane
                child.stop(timeout_s=30.0)
            if children:
                say("goodput demo: stopped every process it started")


@dataclass(frozen=True, slots=True)
class _Keys:
    ingest: str
    agent: str
    viewer: str
    operator: str


def _sign_in_links(cp_url: str, keys: dict[str, str]) -> list[str]:
    import httpx

    from goodput.demo import sign_in_links

    with httpx.Client(base_url=cp_url, timeout=5.0) as client:
        return sign_in_links(client, keys)


def _prepare(options: StackOptions, directory: Path, env: dict[str, str], say: Say) -> _Keys:
    import yaml

    run_cli(env, "db", "upgrade")

    def key(role: str) -> str:
        return run_cli(env, "admin", "create-key", "--role", role, "--name", f"demo-{role}").strip()

    keys = _Keys(key("ingest"), key("agent"), key("viewer"), key("operator"))
    # The demo SLO, selecting the model this stack serves.
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
    return keys


def _run(
    options: StackOptions, stop: threading.Event, say: Say, children: list[ChildProcess]
) -> int:
    from serving.model import default_model_dir

    directory = options.directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if options.fresh:
        for path in directory.glob("goodput.db*"):
            path.unlink()
    sim = options.engine == "sim"
    engines = f"{SIM_PROFILE} sim" if sim else "vLLM"
    say(f"goodput demo: the full stack (control plane, {engines} prefill + decode, PD gateway)")
    env = {**os.environ, "GOODPUT_DATABASE_URL": f"sqlite:///{directory / 'goodput.db'}"}
    # In a child process: the demo itself stays free of the builder's threads and imports
    # (its children are forked from it). Returns at once when the model is there.
    model_dir = default_model_dir()
    if not sim:
        run_cli(env, "model", "build-tiny", str(model_dir), timeout_s=600.0)
    keys = _prepare(options, directory, env, say)
    if stop.is_set():
        return 0
    host = options.host
    cp_port = pick_port(host, options.port)
    cp_url = f"http://{host}:{cp_port}"
    kv_dir = directory / "kv"
    shutil.rmtree(kv_dir, ignore_errors=True)  # KV of an earlier run is never read again
    kv_dir.mkdir()
    python = [sys.executable, "-m", "goodput"]

    def start(name: str, argv: list[str]) -> ChildProcess:
        child = ChildProcess([*python, *argv], env, directory / f"{name}.log")
        children.append(child)
        return child

    control_plane = start(
        "controlplane",
        ["controlplane", "serve", "--no-migrate", "--host", host, "--port", str(cp_port)],
    )
    workers = {}
    for core, role in enumerate(("prefill", "decode")):
        port = pick_port(host, 0)
        if sim:
            workers[role] = (f"http://{host}:{port}", start(role, [
                "worker", "--engine", "sim", "--profile", SIM_PROFILE, "--port", str(port),
                "--host", host, "--role", role, "--kv-dir", str(kv_dir),
                "--served-model-name", SIM_SERVED_MODEL, "--control-plane", cp_url,
                "--agent-key", keys.agent, "--ingest-key", keys.ingest, "--seed", str(core),
            ]))  # fmt: skip
            continue
        workers[role] = (f"http://{host}:{port}", start(role, [
            "worker", "--model", str(model_dir), "--port", str(port), "--host", host,
            "--role", role, "--cpu", str(core), "--kv-dir", str(kv_dir),
            "--served-model-name", SERVED_MODEL, "--control-plane", cp_url,
            "--agent-key", keys.agent, "--ingest-key", keys.ingest,
            "--run-dir", str(directory / f"{role}-run"), "--nice", "10", "--sched-idle",
        ]))  # fmt: skip
    gw_port = pick_port(host, 0)
    gateway_url = f"http://{host}:{gw_port}"
    gateway = start("gateway", [
        "gateway", "--host", host, "--port", str(gw_port),
        "--prefill", workers["prefill"][0], "--decode", workers["decode"][0],
        "--control-plane", cp_url, "--agent-key", keys.agent, "--ingest-key", keys.ingest,
        "--viewer-key", keys.viewer, "--gateway-id", "demo-gateway", "--log-level", "WARNING",
    ])  # fmt: skip
    say(f"goodput demo: logs in {directory}/{{controlplane,prefill,decode,gateway}}.log")
    waits = [(f"{cp_url}/ready", control_plane, "the control plane", 60.0)]
    waits += [(f"{url}/health", child, f"the {role} worker", READY_TIMEOUT_S)
              for role, (url, child) in workers.items()]  # fmt: skip
    waits.append((f"{gateway_url}/health", gateway, "the gateway", 60.0))
    for url, child, what, timeout_s in waits:
        say(f"goodput demo: waiting for {what} ({url})")
        child.wait_http(url, what, stop=stop, timeout_s=timeout_s, every_s=0.5)
    if stop.is_set():
        return 0
    watch = f"{cp_url}/api/v1/goodput?window={options.window}"
    for line in (
        f"goodput demo: gateway at {gateway_url} (OpenAI API; PD: {workers['prefill'][0]} → "
        f"{workers['decode'][0]}), control plane at {cp_url}",
        f"goodput demo: replaying {options.trace} at {options.rate_scale:g}× its rate through "
        f"the gateway (goodput bench; per-request results in {directory / 'bench.json'})",
        "",
        f"Console: {cp_url}/console/",
        *_sign_in_links(cp_url, {"viewer": keys.viewer, "operator": keys.operator}),
        f"Live goodput: {watch}",
        f"  curl -s -H 'Authorization: Bearer {keys.viewer}' '{watch}'",
        f"  curl -N -H 'Authorization: Bearer {keys.viewer}' {cp_url}/api/v1/goodput/stream",
        f"  gateway metrics: curl -s {gateway_url}/metrics",
        ("" if options.duration_s is None else f"Runs for {options.duration_s:g} s; ")
        + "Ctrl-C stops it.",
    ):
        say(line)
    scraped = {"controlplane": cp_url, "gateway": gateway_url}
    scraped.update((role, url) for role, (url, _) in workers.items())
    with demo_monitoring(
        directory / "monitoring", control_plane_url=cp_url, viewer_key=keys.viewer,
        targets={job: url.removeprefix("http://") for job, url in scraped.items()}, say=say,
    ):  # fmt: skip
        say(HEADER)
        return _replay(
            options, gateway_url=gateway_url, cp_url=cp_url, keys=keys, children=children,
            stop=stop, say=say, directory=directory,
        )  # fmt: skip


def _replay(
    options: StackOptions,
    *,
    gateway_url: str,
    cp_url: str,
    keys: _Keys,
    children: list[ChildProcess],
    stop: threading.Event,
    say: Say,
    directory: Path,
) -> int:
    import httpx

    from serving.bench.cli import BenchError, BenchOptions, run_bench

    counts = {"finished": 0, "failed": 0}
    result: dict[str, Any] = {}
    failure: list[BaseException] = []

    def on_record(record: Any) -> None:
        counts["finished"] += 1
        counts["failed"] += record.status.name == "ERROR"

    bench = BenchOptions(
        url=gateway_url,
        trace=options.trace,
        rate_scale=options.rate_scale,
        duration_s=options.duration_s or 24 * 3600.0,
        start_s=options.start_s,
        slo="ttft=0.2,itl=0.05",
        model=options.served_model,
        progress=False,
        out=directory / "bench.json",
        request_id_prefix=f"demo-{int(time.time())}",
    )

    def replay() -> None:
        try:
            with open(directory / "bench.log", "a", encoding="utf-8") as log:
                if options.engine == "sim":  # word prompts: no tokenizer to load
                    from serving.sim.worker.replay import run_word_bench

                    result.update(run_word_bench(bench, log, stop=stop, on_record=on_record))
                else:
                    result.update(run_bench(bench, log, stop=stop, on_record=on_record))
        except (BenchError, ValueError) as exc:
            failure.append(exc)

    thread = threading.Thread(target=replay, name="goodput-demo-bench")
    thread.start()
    started = time.monotonic()
    viewer = {"Authorization": f"Bearer {keys.viewer}"}
    with httpx.Client(base_url=cp_url, headers=viewer, timeout=5.0) as client:
        try:
            while thread.is_alive() and not stop.wait(options.interval_s):
                dead = [c for c in children if not c.alive()]
                if dead:
                    raise DemoError(
                        f"a process exited (log {dead[0].log_path}):\n{dead[0].log_tail()}"
                    )
                say(_line(client, options.window, time.monotonic() - started, counts))
        finally:
            stop.set()
            thread.join()
        say(_line(client, options.window, time.monotonic() - started, counts))
    if failure:
        raise DemoError(f"the replay failed: {failure[0]}")
    summary = result.get("summary")
    if summary:
        say(
            f"goodput demo: {summary['completed']} of {summary['requests']} requests completed, "
            f"client-side goodput {summary['goodput_rps']:.2f} req/s for TTFT ≤ 200 ms and "
            f"ITL ≤ 50 ms (bench summary in {directory / 'bench.log'})"
        )
    return 0


def _line(client: Any, window: str, elapsed_s: float, counts: dict[str, int]) -> str:
    """One row under :data:`HEADER`: the goodput API's first SLO over ``window``."""
    try:
        response = client.get("/api/v1/goodput", params={"window": window})
        response.raise_for_status()
        data = response.json()["data"]
    except Exception as exc:  # the line says what went wrong; the demo goes on
        data, problem = None, f"{type(exc).__name__}: {exc}"[:60]
    else:
        problem = "no SLO yet"
    head = f"{elapsed_s:5.0f} s"
    tail = f"{counts['finished']:9d} {counts['failed']:7d}"
    if not data:
        return f"{head}  ({problem})  {tail}"
    stats = data[0]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f} ms"

    attainment, burn = stats["attainment_ratio"], stats["burn_rate"]
    return (
        f"{head} {stats['throughput_rps']:7.2f} {stats['goodput_rps']:8.2f}"
        f"  {'-' if attainment is None else f'{attainment:.2%}':>10}"
        f"  {'-' if burn is None else f'{burn:.2f}':>6}"
        f"  {ms(stats['ttft']['p99_s']):>8}  {ms(stats['itl']['p99_s']):>8}{tail}"
    )
