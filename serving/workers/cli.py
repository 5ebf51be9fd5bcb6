"""``goodput worker``: run one supervised vLLM server in the foreground (docs/serving.md).

    goodput worker --engine vllm --model DIR --role prefill|decode|both --port P
                   [--control-plane URL --agent-key KEY [--ingest-key KEY]]
                   [--kv-dir DIR] [--cpu N] [--device cpu|cuda] [--nice N] [--sched-idle]
                   [--scheduling-policy fcfs|priority] [--[no-]chunked-prefill]
                   [--ready-port P]
                   [--kubernetes-relabel --pod-name NAME
                   [--pod-namespace NS] [--kubernetes-api URL]] [--print-plan]

Registered on the ``goodput`` typer app by :func:`register`. SIGINT/SIGTERM stop the worker
and its server. ``--print-plan`` prints the command line and the environment variables it
sets (JSON) and exits without starting anything.

On Kubernetes (docs/deploy.md, "Roles are labels"): ``--ready-port`` serves ``/ready``
(200 only while the worker is ready: not starting, draining or down;
:mod:`serving.workers.readiness`) for the pod's readinessProbe, and
``--kubernetes-relabel`` makes ``set_role`` patch the pod's ``goodput.dev/role`` label
(:mod:`serving.workers.relabel`) through the in-cluster API server with the pod's service
account, or through ``--kubernetes-api`` without a token (``kubectl proxy``, tests). Both
engines take them (the sim worker: :mod:`serving.sim.worker.cli`).
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Annotated

import typer

from exporters.fleet import PoolRole
from serving.kubernetes_api import KubernetesError
from serving.workers.agent import AgentSettings
from serving.workers.config import Device, SpecError, VllmSpec, build_launch
from serving.workers.kv_folder import KVFolderPolicy
from serving.workers.launcher import ServerError
from serving.workers.readiness import ReadinessServer
from serving.workers.relabel import PodRelabeler, pod_relabeler
from serving.workers.supervisor import SupervisorSettings, WorkerSupervisor

__all__ = ["PLUGIN_ENV", "register", "worker"]

ENGINES = ("vllm", "sim")
# What the stat-logger plugin reads inside the vLLM server (serving/vllm_plugin).
PLUGIN_ENV = ("GOODPUT_CONTROL_PLANE_URL", "GOODPUT_INGEST_KEY")


def worker(
    *,
    port: Annotated[int, typer.Option(help="the vLLM server's port")],
    model: Annotated[
        Path | None, typer.Option(help="model folder (goodput model build-tiny); vllm only")
    ] = None,
    engine: Annotated[
        str, typer.Option(help="serving engine; one of: vllm, sim (docs/sim-worker.md)")
    ] = "vllm",
    profile: Annotated[
        str, typer.Option(help="sim: the timing-model profile")
    ] = "h100-llama3.1-8b",
    sim_config: Annotated[
        str, typer.Option(help="sim: instance keys of goodput sim --cluster, e.g. jitter=0")
    ] = "",
    seed: Annotated[int, typer.Option(help="sim: seed of the step-time jitter")] = 0,
    role: Annotated[
        PoolRole, typer.Option(help="the pool reported to the control plane")
    ] = PoolRole.BOTH,
    host: Annotated[str, typer.Option(help="address the server binds")] = "127.0.0.1",
    device: Annotated[Device, typer.Option(help="cpu (ExampleConnector) or cuda (Nixl)")] = (
        Device.CPU
    ),
    cpu: Annotated[int | None, typer.Option(help="core to bind (CPU) or GPU index")] = None,
    kv_dir: Annotated[
        Path | None, typer.Option(help="shared KV folder (CPU PD); omit for colocated")
    ] = None,
    served_model_name: Annotated[str | None, typer.Option(help="default: folder name")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="vLLM --max-num-seqs")] = None,
    max_model_len: Annotated[
        int | None, typer.Option(help="vLLM --max-model-len (2048); sim: the KV capacity")
    ] = None,
    compile_model: Annotated[
        bool, typer.Option("--compile/--eager", help="torch.compile (slow start) or eager")
    ] = False,
    control_plane: Annotated[str | None, typer.Option(help="control-plane URL")] = None,
    agent_key: Annotated[str | None, typer.Option(help="API key with role agent")] = None,
    ingest_key: Annotated[
        str | None, typer.Option(help="API key with role ingest, for the engine's records")
    ] = None,
    member_id: Annotated[str | None, typer.Option(help="fleet id; default host:port")] = None,
    fleet_tenant: Annotated[
        str | None, typer.Option(help="tenant whose pool this worker serves (fleet registry)")
    ] = None,
    advertise_url: Annotated[str | None, typer.Option(help="URL others reach it at")] = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="TMPDIR/cache/log folder; default a temporary one")
    ] = None,
    kv_max_age_s: Annotated[float, typer.Option(help="KV folder GC: max age")] = 600.0,
    kv_max_bytes: Annotated[int, typer.Option(help="KV folder GC: max total bytes")] = 1 << 30,
    heartbeat_interval_s: Annotated[float, typer.Option(help="agent heartbeat period")] = 5.0,
    nice: Annotated[
        int,
        typer.Option(
            min=0,
            max=19,
            help="once ready, run vLLM at this lower CPU priority (0..19), so it does "
            "not starve a gateway or client on the same cores",
        ),
    ] = 0,
    sched_idle: Annotated[
        bool,
        typer.Option(
            help="once ready, also run vLLM under SCHED_IDLE (Linux): shorter waits for a "
            "gateway or client on its cores"
        ),
    ] = False,
    scheduling_policy: Annotated[
        str | None,
        typer.Option(
            help="vLLM --scheduling-policy: fcfs (vLLM's default) or priority (waiting "
            "requests by the body's priority, lower first: what the gateway's "
            "--engine-priority sends); vllm only"
        ),
    ] = None,
    chunked_prefill: Annotated[
        bool | None,
        typer.Option(
            "--chunked-prefill/--no-chunked-prefill",
            help="vLLM --enable-chunked-prefill / --no-enable-chunked-prefill (default: "
            "vLLM's, on). Off, prompts are prefilled whole: the shared-folder connector "
            "publishes every one, and a higher priority never waits for a lower one's "
            "remaining chunks; vllm only",
        ),
    ] = None,
    ready_port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535,
            help="serve /ready on this port: 200 only while ready (not starting, draining "
            "or down), for a Kubernetes readinessProbe",
        ),
    ] = None,
    kubernetes_relabel: Annotated[
        bool,
        typer.Option(
            help="set_role also patches this pod's goodput.dev/role label (needs --pod-name "
            "and get/patch on pods)"
        ),
    ] = False,
    pod_name: Annotated[
        str, typer.Option(help="this worker's pod (downward API)", envvar="POD_NAME")
    ] = "",
    pod_namespace: Annotated[
        str,
        typer.Option(
            help="the pod's namespace (default: the service account's)", envvar="POD_NAMESPACE"
        ),
    ] = "",
    kubernetes_api: Annotated[
        str | None,
        typer.Option(
            help="API server URL, used without a token (kubectl proxy); default: in-cluster"
        ),
    ] = None,
    print_plan: Annotated[bool, typer.Option(help="print the launch plan and exit")] = False,
) -> None:
    """Start and supervise one vLLM server (restarts, KV folder GC, control-plane agent).

    It restarts the server if it dies, keeps the shared KV folder bounded, and registers
    with the control plane and beats when --control-plane is given."""
    if engine not in ENGINES:
        typer.echo(f"error: --engine must be one of {', '.join(ENGINES)}, got {engine!r}", err=True)
        raise typer.Exit(code=2)
    if engine == "sim":
        from serving.sim.worker.cli import cli_main

        cli_main(
            profile=profile, port=port, host=host, role=role, sim_config=sim_config,
            max_num_seqs=max_num_seqs, max_model_len=max_model_len,
            served_model_name=served_model_name, kv_dir=kv_dir, seed=seed,
            control_plane=control_plane, agent_key=agent_key, ingest_key=ingest_key,
            member_id=member_id, fleet_tenant=fleet_tenant,
            advertise_url=advertise_url, heartbeat_interval_s=heartbeat_interval_s,
            ready_port=ready_port, kubernetes_relabel=kubernetes_relabel, pod_name=pod_name,
            pod_namespace=pod_namespace, kubernetes_api=kubernetes_api, print_plan=print_plan,
        )  # fmt: skip
        return
    if model is None:
        typer.echo("error: --model is required with --engine vllm", err=True)
        raise typer.Exit(code=2)
    engine_env = {}
    if control_plane and ingest_key:
        engine_env = dict(zip(PLUGIN_ENV, (control_plane, ingest_key), strict=True))
    try:
        spec = VllmSpec(
            model=model.resolve(),
            port=port,
            host=host,
            device=device,
            kv_dir=kv_dir.resolve() if kv_dir else None,
            cpu=cpu,
            served_model_name=served_model_name,
            max_model_len=max_model_len or 2048,
            max_num_seqs=max_num_seqs,
            enforce_eager=not compile_model,
            engine_env=engine_env,
            nice=nice,
            sched_idle=sched_idle,
            scheduling_policy=scheduling_policy,
            chunked_prefill=chunked_prefill,
        )
        policy = KVFolderPolicy(max_age_s=kv_max_age_s, max_bytes=kv_max_bytes)
        agent = None
        if control_plane:
            agent = AgentSettings(
                url=control_plane,
                key=agent_key,
                member_id=member_id or f"{host}:{port}",
                endpoint=advertise_url or spec.url,
                model=spec.model_name,
                heartbeat_interval_s=heartbeat_interval_s,
                tenant=fleet_tenant,
            )
        relabeler = None
        if kubernetes_relabel and not print_plan:
            relabeler = pod_relabeler(
                control_plane=control_plane,
                pod_name=pod_name,
                pod_namespace=pod_namespace,
                api_url=kubernetes_api,
            )
    except (SpecError, ValueError, KubernetesError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if print_plan:
        plan = build_launch(spec, run_dir=run_dir or Path("RUN_DIR"), base_env={})
        shown = {"argv": plan.argv, "env": plan.env, "nice": nice, "sched_idle": sched_idle}
        typer.echo(json.dumps(shown, indent=2))
        return
    if not (model / "config.json").is_file():
        typer.echo(f"error: --model {model} has no config.json", err=True)
        raise typer.Exit(code=2)
    _serve(spec, role, policy, agent, run_dir, relabeler=relabeler, ready_port=ready_port)


def _serve(
    spec: VllmSpec,
    role: PoolRole,
    policy: KVFolderPolicy,
    agent: AgentSettings | None,
    run_dir: Path | None,
    *,
    relabeler: PodRelabeler | None = None,
    ready_port: int | None = None,
) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health check
    temporary = run_dir is None
    folder = Path(tempfile.mkdtemp(prefix=f"goodput-worker-{spec.port}-")) if temporary else run_dir
    assert folder is not None
    supervisor = WorkerSupervisor(
        spec,
        run_dir=folder,
        role=role,
        settings=SupervisorSettings(kv_policy=policy),
        agent=agent,
        relabeler=relabeler,
    )
    ready = None
    if ready_port is not None:  # before the engine: the probe then reads 503 "starting"
        ready = ReadinessServer(lambda: supervisor.status().state, host=spec.host, port=ready_port)
        ready.start()
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    supervisor.start()
    try:
        try:
            supervisor.wait_ready(timeout_s=supervisor.settings.ready_timeout_s)
            typer.echo(f"worker ready: {spec.url} (role {role.value}, log {folder})", err=True)
        except ServerError as exc:
            typer.echo(f"warning: {exc}", err=True)  # the supervisor keeps retrying
        while not done.wait(1.0):
            pass
    finally:
        supervisor.stop()
        if ready is not None:
            ready.stop()
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)


def register(app: typer.Typer) -> None:
    """Add ``goodput worker`` to ``app``."""
    app.command("worker")(worker)
