"""``goodput demo``: the control plane watching a replayed trace, live, in one command.

It migrates a SQLite database under ``--dir``, mints an ingest key and a viewer key,
applies ``examples/demo-slo.yaml``, starts ``goodput controlplane serve`` as a child
process, then replays the Azure LLM 2023 conversation trace in real time (token times from
the stand-in latency model, :mod:`serving.replay`) through the real
:class:`~exporters.transport.ControlPlaneExporter` into the control plane's ingest. It
prints where to watch (a URL and a ready-to-paste ``curl`` with the viewer key) and, every
``--interval`` seconds, one line from the goodput API. ``--duration`` bounds the run;
otherwise Ctrl-C (SIGINT) or SIGTERM stops it. Either way it stops what it started, in
order: the replay, the exporter (flushed), then the control plane (SIGTERM, then SIGKILL).

The control plane and the replay meet only over HTTP, as in production: this module runs
the CLI as subprocesses and never imports ``controlplane``. See ``docs/demo.md``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from goodput._demo_processes import ChildProcess, DemoError, pick_port, run_cli, signals_set
from goodput.demo_console import sign_in_links
from goodput.demo_prometheus import demo_monitoring

if TYPE_CHECKING:
    import httpx

    from exporters.transport import ControlPlaneExporter
    from serving.replay import RampSchedule, ReplayDriver
    from serving.traces import Trace

__all__ = ["SUMMARY_HEADER", "DemoError", "DemoOptions", "demo", "format_summary", "run_demo"]

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SLO_FILE = REPO_ROOT / "examples" / "demo-slo.yaml"
SUMMARY_HEADER = (
    "  time   rate   req/s  goodput  attainment    burn  p99 TTFT   p99 ITL  exported  dropped"
)
READY_TIMEOUT_S = 60.0

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``goodput demo`` runs (the command's options, see :func:`demo`)."""

    directory: Path = Path("var/demo")
    duration_s: float | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    trace: str = "azure_conv"
    rate_low: float = 1.0
    rate_high: float = 5.0
    ramp_period_s: float = 120.0
    seed: int = 0
    interval_s: float = 5.0
    window: str = "1m"
    slo_file: Path = DEFAULT_SLO_FILE
    fresh: bool = False


_DEFAULTS = DemoOptions()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def format_summary(
    stats: Mapping[str, Any] | None,
    *,
    elapsed_s: float,
    rate_scale: float,
    exported: int,
    dropped: int,
    problem: str = "",
) -> str:
    """One row under :data:`SUMMARY_HEADER` from a ``GoodputStatsPublic`` JSON object
    (``None``: the query failed, ``problem`` says how)."""
    head = f"{elapsed_s:5.0f} s  {rate_scale:4.1f}×"
    tail = f"{exported:8d} {dropped:8d}"
    if stats is None:
        return f"{head}  ({problem or 'no answer'})  {tail}"
    attainment, burn = stats["attainment_ratio"], stats["burn_rate"]
    return (
        f"{head} {stats['throughput_rps']:7.1f} {stats['goodput_rps']:8.1f}"
        f"  {'-' if attainment is None else f'{attainment:.2%}':>10}"
        f"  {'-' if burn is None else f'{burn:.2f}':>6}"
        f"  {_ms(stats['ttft']['p99_s']):>8}  {_ms(stats['itl']['p99_s']):>8}  {tail}"
    )


def describe_slo(slo: Mapping[str, Any]) -> str:
    """``TTFT ≤ 200 ms and ITL ≤ 50 ms for 99 % of requests`` from an ``SLOPublic`` object."""
    names = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2el": "E2EL"}
    parts = [
        names.get(o["metric"], o["metric"])
        + ("" if o.get("statistic", "max") == "max" else f" {o['statistic']}")
        + f" ≤ {o['threshold_s'] * 1000:g} ms"
        for o in slo["objectives"]
    ]
    return f"{' and '.join(parts)} for {slo['target'] * 100:g} % of requests"


def run_demo(options: DemoOptions, out: IO[str] | None = None) -> int:
    """Run the demo (see the module) from the main thread; the exit code: 0 when it ran and
    stopped cleanly (at the end of the duration or on SIGINT/SIGTERM), 1 when a step failed."""
    stream = out or sys.stdout
    stop = threading.Event()

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    with signals_set(stop):
        try:
            return _run(options, stop, say)
        except DemoError as exc:
            if stop.is_set():  # Ctrl-C during the setup also interrupted the step it ran
                say("goodput demo: stopped before the replay started")
                return 0
            say(f"goodput demo: {exc}")
            return 1


@dataclass(frozen=True, slots=True)
class _Setup:
    env: dict[str, str]
    ingest_key: str
    viewer_key: str
    operator_key: str
    slo_name: str


def _prepare(options: DemoOptions, say: Say) -> _Setup:
    """Migrate the demo database, mint the two keys and apply the SLO file (CLI steps)."""
    directory = options.directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if options.fresh:  # the database, its WAL and ingest log, the monitoring data
        for path in [*directory.glob("goodput.db*"), directory / "monitoring"]:
            if path.exists():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    database_url = f"sqlite:///{directory / 'goodput.db'}"
    env = {**os.environ, "GOODPUT_DATABASE_URL": database_url}
    say(f"goodput demo: database {database_url}")
    run_cli(env, "db", "upgrade")
    ingest_key = run_cli(env, "admin", "create-key", "--role", "ingest", "--name", "demo-ingest")
    viewer_key = run_cli(env, "admin", "create-key", "--role", "viewer", "--name", "demo-viewer")
    operator_key = run_cli(
        env, "admin", "create-key", "--role", "operator", "--name", "demo-operator"
    )
    applied = run_cli(env, "slo", "apply", "-f", str(options.slo_file)).split()
    if len(applied) < 2:  # "created demo-chat (version 1)"
        raise DemoError(f"`goodput slo apply` printed no SLO for {options.slo_file}")
    return _Setup(env, ingest_key.strip(), viewer_key.strip(), operator_key.strip(), applied[1])


def _run(options: DemoOptions, stop: threading.Event, say: Say) -> int:
    import httpx

    from serving.replay import RampSchedule
    from serving.traces import TraceError, load_trace

    try:
        trace = load_trace(options.trace)
        schedule = RampSchedule(options.rate_low, options.rate_high, options.ramp_period_s)
    except TraceError as exc:
        raise DemoError(f"cannot load trace {options.trace!r}: {exc}") from None
    except ValueError as exc:  # the ramp's message names the field and the value
        raise DemoError(f"invalid rate ramp: {exc}") from None
    setup = _prepare(options, say)
    if stop.is_set():
        return 0
    port = pick_port(options.host, options.port)
    if options.port and port != options.port:
        say(f"goodput demo: port {options.port} is taken; using {port}")
    base_url = f"http://{options.host}:{port}"
    server = ChildProcess(
        [sys.executable, "-m", "goodput", "controlplane", "serve", "--no-migrate",
         "--host", options.host, "--port", str(port)],
        setup.env,
        options.directory.resolve() / "controlplane.log",
    )  # fmt: skip
    viewer = {"Authorization": f"Bearer {setup.viewer_key}"}
    try:
        with httpx.Client(base_url=base_url, headers=viewer, timeout=5.0) as client:
            _wait_ready(client, server, stop)
            if stop.is_set():
                return 0
            response = client.get(f"/api/v1/slos/{setup.slo_name}")
            if response.status_code != 200:
                raise DemoError(
                    f"reading SLO {setup.slo_name!r} answered HTTP {response.status_code}: "
                    f"{response.text[:300]}"
                )
            watch = f"{base_url}/api/v1/slos/{setup.slo_name}/goodput?window={options.window}"
            for line in (
                f"goodput demo: control plane at {base_url} (pid {server.pid}, "
                f"log {server.log_path})",
                f"goodput demo: SLO {setup.slo_name}: {describe_slo(response.json())} "
                f"({options.slo_file.name})",
                f"goodput demo: replaying {trace.name} ({len(trace)} requests) at "
                f"{schedule.low:g}×–{schedule.high:g}× its rate, ramping over "
                f"{schedule.period_s:g} s; token times from the stand-in 1P1D Llama-3.1-8B "
                "model (docs/demo.md)",
                "",
                f"Console: {base_url}/console/",
                *sign_in_links(
                    client, {"viewer": setup.viewer_key, "operator": setup.operator_key}
                ),
                f"Live goodput: {watch}",
                f"  curl -s -H 'Authorization: Bearer {setup.viewer_key}' '{watch}'",
                f"  curl -N -H 'Authorization: Bearer {setup.viewer_key}' "
                f"{base_url}/api/v1/goodput/stream",
                ("" if options.duration_s is None else f"Runs for {options.duration_s:g} s; ")
                + "Ctrl-C stops it.",
            ):
                say(line)
            with demo_monitoring(
                options.directory.resolve() / "monitoring", control_plane_url=base_url,
                viewer_key=setup.viewer_key, targets={"controlplane": f"{options.host}:{port}"},
                say=say,
            ):  # fmt: skip
                say(SUMMARY_HEADER)
                return _replay(
                    options,
                    setup,
                    schedule=schedule,
                    trace=trace,
                    client=client,
                    server=server,
                    stop=stop,
                    say=say,
                )
    finally:
        server.stop()


def _replay(
    options: DemoOptions,
    setup: _Setup,
    *,
    schedule: RampSchedule,
    trace: Trace,
    client: httpx.Client,
    server: ChildProcess,
    stop: threading.Event,
    say: Say,
) -> int:
    """Replay on a thread and print summary lines until the duration ends or ``stop``."""
    from exporters.transport import ControlPlaneExporter
    from serving.replay import ReplayDriver

    exporter = ControlPlaneExporter(str(client.base_url), api_key=setup.ingest_key)
    driver = ReplayDriver(trace, exporter, schedule=schedule, seed=options.seed)
    thread = threading.Thread(
        target=driver.run, args=(stop, options.duration_s), name="goodput-replay"
    )
    thread.start()
    last = ""
    try:
        while thread.is_alive() and not stop.wait(options.interval_s):
            if not server.alive():
                raise DemoError(
                    f"the control plane exited with code {server.process.returncode}:\n"
                    f"{server.log_tail()}"
                )
            last = _summary(options, setup, client, exporter, driver)
            say(last)
        stop.set()
        thread.join()
        exporter.shutdown(timeout_s=5.0)  # delivers what finished before the end
        final = _summary(options, setup, client, exporter, driver)
        if final != last:  # the run may have ended right on a summary tick
            say(final)
        progress = driver.stats()
        say(
            f"goodput demo: stopped after {progress.elapsed_s:.0f} s; {progress.num_arrived} "
            f"requests replayed, {progress.num_exported} finished and exported"
        )
        return 0
    finally:
        stop.set()
        thread.join()
        exporter.shutdown(timeout_s=2.0)  # idempotent: a no-op after the one above


def _summary(
    options: DemoOptions,
    setup: _Setup,
    client: httpx.Client,
    exporter: ControlPlaneExporter,
    driver: ReplayDriver,
) -> str:
    import httpx

    # Read your writes: what finished before this line is delivered before the query, so
    # the goodput figures and the exported count describe the same requests.
    exporter.force_flush(timeout_s=min(1.0, options.interval_s / 2))
    progress, sent = driver.stats(), exporter.stats()
    stats, problem = None, ""
    try:
        response = client.get(
            f"/api/v1/slos/{setup.slo_name}/goodput", params={"window": options.window}
        )
        response.raise_for_status()
        stats = response.json()
    except httpx.HTTPError as exc:
        problem = f"{type(exc).__name__}: {exc}"[:60]
    return format_summary(
        stats,
        elapsed_s=progress.elapsed_s,
        rate_scale=progress.rate_scale,
        exported=sent.num_exported_records,
        dropped=sent.num_dropped_records + sent.num_rejected_records,
        problem=problem,
    )


def _wait_ready(client: httpx.Client, server: ChildProcess, stop: threading.Event) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = "no answer yet"
    while not stop.is_set():
        if not server.alive():
            raise DemoError(
                f"the control plane exited with code {server.process.returncode} before it was "
                f"ready:\n{server.log_tail()}"
            )
        try:
            response = client.get("/ready", timeout=2.0)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except Exception as exc:  # refused while it starts: keep asking until the deadline
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise DemoError(
                f"the control plane was not ready within {READY_TIMEOUT_S:g} s ({last})"
            )
        stop.wait(0.2)


def demo(
    *,
    duration: Annotated[
        float | None,
        typer.Option("--duration", min=1, help="seconds to replay; default: until Ctrl-C"),
    ] = None,
    directory: Annotated[
        Path, typer.Option("--dir", help="folder for the demo's SQLite database and logs")
    ] = _DEFAULTS.directory,
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="control-plane port (0 or taken: a free one)")
    ] = _DEFAULTS.port,
    host: Annotated[str, typer.Option(help="control-plane address")] = _DEFAULTS.host,
    trace: Annotated[
        str, typer.Option(help="trace name (azure_conv, azure_code, mooncake) or file")
    ] = _DEFAULTS.trace,
    rate_low: Annotated[
        float, typer.Option(min=0.01, help="rate scale at the ramp's bottom")
    ] = _DEFAULTS.rate_low,
    rate_high: Annotated[
        float, typer.Option(min=0.01, help="rate scale at the ramp's top")
    ] = _DEFAULTS.rate_high,
    ramp_period: Annotated[
        float, typer.Option(min=1, help="seconds from bottom to top and back")
    ] = _DEFAULTS.ramp_period_s,
    seed: Annotated[int, typer.Option(help="seed of the model's jitter and labels")] = 0,
    interval: Annotated[
        float, typer.Option(min=0.5, help="seconds between summary lines")
    ] = _DEFAULTS.interval_s,
    window: Annotated[
        str, typer.Option(help="goodput window of the summary: 10s, 1m, 5m, 1h")
    ] = _DEFAULTS.window,
    slo_file: Annotated[
        Path | None,
        typer.Option(
            help="SLOs to apply (default examples/demo-slo.yaml; vllm|sim: "
            "examples/demo-loop-slo.yaml)"
        ),
    ] = None,
    fresh: Annotated[
        bool,
        typer.Option(
            help="--engine model: start from an empty database (vllm|sim always start from one)"
        ),
    ] = False,
    engine: Annotated[
        str,
        typer.Option(
            help="model: token times from the latency model (fast, no vLLM); vllm: the full "
            "stack, real vLLM prefill + decode behind the PD gateway (goodput/demo_stack.py); "
            "sim: the same stack on H100 Llama-3.1-8B sim workers (docs/sim-worker.md); both run "
            "the control-loop scenario of docs/demo.md"
        ),
    ] = "model",
    overload: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="--engine vllm|sim: offered load ÷ the measured capacity of one prefill worker",
        ),
    ] = 2.5,
) -> None:
    """Replay the Azure LLM trace into a local control plane and print live goodput."""
    if engine not in ("model", "vllm", "sim"):
        typer.echo(f"error: --engine must be 'model', 'vllm' or 'sim', got {engine!r}", err=True)
        raise typer.Exit(code=2)
    if engine in ("vllm", "sim"):
        from goodput.demo_stack import StackOptions, run_demo_stack

        stack = StackOptions(
            directory=directory, duration_s=duration, host=host, port=port,
            overload=overload, interval_s=interval, engine=engine,
        )  # fmt: skip
        if slo_file is not None:
            stack = dataclasses.replace(stack, slo_file=slo_file)
        raise typer.Exit(run_demo_stack(stack))
    options = DemoOptions(
        directory=directory,
        duration_s=duration,
        host=host,
        port=port,
        trace=trace,
        rate_low=rate_low,
        rate_high=rate_high,
        ramp_period_s=ramp_period,
        seed=seed,
        interval_s=interval,
        window=window,
        slo_file=slo_file or DEFAULT_SLO_FILE,
        fresh=fresh,
    )
    raise typer.Exit(run_demo(options))
