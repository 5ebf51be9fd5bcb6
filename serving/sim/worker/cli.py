"""``goodput worker --engine sim``: one sim worker in the foreground (docs/sim-worker.md).

    goodput worker --engine sim --profile h100-llama3.1-8b --role prefill|decode|both \\
        --port P [--host H] [--kv-dir DIR] [--sim-config 'strategy=chunked,jitter=0.02']
        [--max-num-seqs N] [--max-model-len L] [--served-model-name NAME] [--seed S]
        [--control-plane URL --agent-key KEY] [--member-id ID] [--advertise-url URL]
        [--ready-port P] [--kubernetes-relabel --pod-name NAME [--pod-namespace NS]
        [--kubernetes-api URL]]

``serving.workers.cli.worker`` parses the shared options and calls :func:`cli_main`.
On Kubernetes the sim worker is a vLLM worker's stand-in (docs/deploy.md, "Roles are
labels"): ``--ready-port`` serves ``/ready`` (:class:`~serving.workers.readiness.ReadinessServer`
on :attr:`SimWorkerControl.state`: 503 while starting, draining, drained or down) and
``--kubernetes-relabel`` makes ``set_role`` patch the pod's ``goodput.dev/role`` label first
(:func:`~serving.workers.relabel.pod_relabeler`, the vLLM worker's code).
``--sim-config`` takes the instance keys of ``goodput sim --cluster`` (strategy, max_seqs,
max_batched_tokens, batch_size, batch_window, kv_tokens, memory_utilization, prefix_cache,
jitter, link), so a sim worker and a simulated instance are configured alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from exporters.fleet import PoolRole
from exporters.prometheus import KVTransferExporter
from exporters.sinks import RecordSink
from serving.kubernetes_api import KubernetesError
from serving.sim.cluster.spec import ClusterSpecError, parse_cluster
from serving.sim.instance import InstanceConfig
from serving.sim.latency_model import LatencyModel, get_profile, profile_names
from serving.sim.worker.control import SimWorkerControl
from serving.sim.worker.engine import SimEngine
from serving.sim.worker.handoff import KVHandoff
from serving.sim.worker.records import EngineRecords
from serving.sim.worker.server import ServerSettings, create_app
from serving.workers.agent import Agent, AgentSettings
from serving.workers.readiness import ReadinessServer
from serving.workers.relabel import PodRelabeler, pod_relabeler

__all__ = [
    "SimWorkerError",
    "SimWorkerSpec",
    "build_worker",
    "cli_main",
    "parse_sim_config",
    "run_sim_worker",
]

# Llama 3.1's context; a smaller KV capacity lowers the default (vLLM refuses to start
# when max_model_len exceeds what its KV cache holds).
DEFAULT_MAX_MODEL_LEN = 131_072
_FORBIDDEN = ("prefill", "decode", "gpu", "model", "tp", "gpus_per_node")


class SimWorkerError(ValueError):
    """A sim worker that cannot start as asked; the message names the option."""


@dataclass(frozen=True, slots=True)
class SimWorkerSpec:
    """Everything one sim worker is started with (see the module docstring)."""

    profile: str = "h100-llama3.1-8b"
    port: int = 8100
    host: str = "127.0.0.1"
    role: PoolRole = PoolRole.BOTH
    sim_config: str = ""
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    served_model_name: str | None = None
    kv_dir: Path | None = None
    seed: int = 0
    control_plane: str | None = None  # with ingest_key: engine records shipped there
    ingest_key: str | None = None
    ready_port: int | None = None  # /ready for a Kubernetes readinessProbe

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def parse_sim_config(text: str) -> tuple[InstanceConfig, str]:
    """The instance configuration and KV link of a ``--sim-config`` string."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    for part in parts:
        key = part.partition("=")[0].strip().lower()
        if key in _FORBIDDEN:
            raise SimWorkerError(
                f"--sim-config: {key!r} is not an instance setting (the profile names the GPU, "
                f"model and tp; the worker is one instance); allowed keys: strategy, max_seqs, "
                "max_batched_tokens, batch_size, batch_window, kv_tokens, memory_utilization, "
                "prefix_cache, jitter, link"
            )
    try:
        spec = parse_cluster(",".join(["prefill=1", "decode=1", *parts]))
    except ClusterSpecError as exc:
        raise SimWorkerError(f"--sim-config: {exc}") from None
    link = "nvlink" if spec.link == "auto" else spec.link  # one prefill-decode pair, one node
    return spec.instance, link


def build_worker(
    spec: SimWorkerSpec,
) -> tuple[SimEngine, ServerSettings, KVHandoff, SimWorkerControl]:
    """The engine, server settings, hand-off and control of ``spec`` (validated)."""
    try:
        profile = get_profile(spec.profile)
    except KeyError:
        raise SimWorkerError(
            f"--profile: unknown profile {spec.profile!r}; known: {', '.join(profile_names())}"
        ) from None
    config, link = parse_sim_config(spec.sim_config)
    if spec.max_num_seqs is not None:
        if spec.max_num_seqs < 1:
            raise SimWorkerError(f"--max-num-seqs: must be >= 1, got {spec.max_num_seqs}")
        config = replace(config, max_num_seqs=spec.max_num_seqs)
    if spec.ready_port is not None and spec.ready_port == spec.port:
        raise SimWorkerError(
            f"--ready-port: must differ from --port (the server's), got {spec.ready_port}"
        )
    latency = LatencyModel(profile)
    try:
        engine = SimEngine(latency, config, link=link, seed=spec.seed, name=spec.url)
    except ValueError as exc:
        raise SimWorkerError(f"--profile/--sim-config: {exc}") from None
    capacity = engine.max_context_tokens
    max_len = spec.max_model_len or min(DEFAULT_MAX_MODEL_LEN, capacity)
    if not 2 <= max_len <= capacity:
        raise SimWorkerError(
            f"--max-model-len: must be in [2, {capacity}] (the KV cache holds {capacity} "
            f"tokens), got {max_len}"
        )
    settings = ServerSettings(
        served_model_name=spec.served_model_name or latency.model.name,
        max_model_len=max_len,
        profile=profile.name,
    )
    handoff = KVHandoff(
        engine_id=f"sim-{spec.host}:{spec.port}",
        host=spec.host,
        port=spec.port,
        block_size=config.block_size,
        tp_size=latency.tensor_parallel,
        folder=spec.kv_dir,
    )
    # ``starting`` until the server's lifespan has started the engine (then /ready is 200)
    return engine, settings, handoff, SimWorkerControl(engine, spec.role, starting=True)


def run_sim_worker(
    spec: SimWorkerSpec,
    agent: AgentSettings | None = None,
    *,
    relabeler: PodRelabeler | None = None,
) -> None:
    """Serve ``spec`` with uvicorn until SIGINT/SIGTERM; registers and beats with
    ``agent``'s control plane when given, its ``set_role`` relabelling the pod through
    ``relabeler`` first (which needs ``agent``); ``/ready`` on ``spec.ready_port``."""
    import uvicorn

    if relabeler is not None and agent is None:
        raise SimWorkerError("--kubernetes-relabel needs --control-plane (set_role comes from it)")
    engine, settings, handoff, control = build_worker(spec)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    stops: list[Callable[[], object]] = []
    extra_info = None
    # Engine records: the KV hand-off metrics on /metrics, and the control plane's ingest
    # (as the vLLM plugin ships them) when one is given.
    registry = CollectorRegistry(auto_describe=False)
    shipped: RecordSink | None = None
    if spec.control_plane and spec.ingest_key:
        from exporters.transport import ControlPlaneExporter

        exporter = ControlPlaneExporter(
            spec.control_plane, api_key=spec.ingest_key, exporter_id=f"sim-{spec.host}:{spec.port}"
        )
        shipped = exporter
        stops.append(lambda: exporter.shutdown(timeout_s=5.0))

        def extra_info() -> dict[str, Any]:
            return {"engine_records": asdict(exporter.stats())}

    kv_sink = KVTransferExporter(registry)
    EngineRecords(engine, shipped, model=settings.served_model_name, kv_sink=kv_sink).attach()

    runner = None
    if agent is not None:
        agent = replace(agent, model=settings.served_model_name)
        runner = Agent(
            agent, report=control.report, apply=control.apply_command, relabeler=relabeler
        )
        stops.insert(0, runner.stop)
    app = create_app(
        engine,
        settings,
        handoff,
        control,
        on_start=runner.start if runner is not None else None,
        on_stop=lambda: _run_all(stops),
        extra_info=extra_info,
        registry=registry,
    )
    logging.getLogger(__name__).info(
        "sim worker %s: %s (%s batching, max_num_seqs %d, KV %d tokens, max_model_len %d, "
        "link %s), role %s, model %r%s",
        spec.url, settings.profile, engine.config.strategy.value, engine.config.max_num_seqs,
        engine.max_context_tokens, settings.max_model_len, engine.link.name, spec.role.value,
        settings.served_model_name,
        "" if relabeler is None else f", relabels pod {relabeler.namespace}/{relabeler.pod}",
    )  # fmt: skip
    ready = None
    if spec.ready_port is not None:  # before the engine: the probe then reads 503 "starting"
        ready = ReadinessServer(lambda: control.state, host=spec.host, port=spec.ready_port)
        ready.start()
    try:
        uvicorn.run(app, host=spec.host, port=spec.port, log_level="warning", access_log=False)
    finally:
        if ready is not None:
            ready.stop()


def _run_all(calls: list[Callable[[], object]]) -> None:
    for call in calls:
        call()


def cli_main(
    *,
    profile: str,
    port: int,
    host: str,
    role: PoolRole,
    sim_config: str,
    max_num_seqs: int | None,
    max_model_len: int | None,
    served_model_name: str | None,
    kv_dir: Path | None,
    seed: int,
    control_plane: str | None,
    agent_key: str | None,
    ingest_key: str | None,
    member_id: str | None,
    advertise_url: str | None,
    heartbeat_interval_s: float,
    fleet_tenant: str | None = None,
    ready_port: int | None = None,
    kubernetes_relabel: bool = False,
    pod_name: str = "",
    pod_namespace: str = "",
    kubernetes_api: str | None = None,
    print_plan: bool = False,
) -> None:
    """``goodput worker --engine sim`` after the shared options are parsed: exit code 2
    with the message on invalid input; ``print_plan`` prints what would be served (JSON)
    and starts nothing. The Kubernetes options mean what they do for ``--engine vllm``
    (:mod:`serving.workers.cli`)."""
    import json

    import typer

    spec = SimWorkerSpec(
        profile=profile, port=port, host=host, role=PoolRole(role), sim_config=sim_config,
        max_num_seqs=max_num_seqs, max_model_len=max_model_len,
        served_model_name=served_model_name, kv_dir=kv_dir.resolve() if kv_dir else None,
        seed=seed, control_plane=control_plane, ingest_key=ingest_key, ready_port=ready_port,
    )  # fmt: skip
    try:
        agent = None
        if control_plane:
            agent = AgentSettings(
                url=control_plane,
                key=agent_key,
                member_id=member_id or f"{host}:{port}",
                endpoint=advertise_url or spec.url,
                heartbeat_interval_s=heartbeat_interval_s,
                tenant=fleet_tenant,
            )
        engine, settings, handoff, _ = build_worker(spec)  # validate before serving
        relabeler = None
        if kubernetes_relabel and not print_plan:
            relabeler = pod_relabeler(
                control_plane=control_plane,
                pod_name=pod_name,
                pod_namespace=pod_namespace,
                api_url=kubernetes_api,
            )
    except (SimWorkerError, ValueError, KubernetesError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if print_plan:
        config = engine.config
        plan = {
            "engine": "sim", "url": spec.url, "role": spec.role.value,
            "profile": settings.profile, "served_model_name": settings.served_model_name,
            "max_model_len": settings.max_model_len, "strategy": config.strategy.value,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "kv_capacity_tokens": engine.max_context_tokens, "link": engine.link.name,
            "jitter": config.jitter_ratio, "seed": spec.seed,
            "kv_dir": None if handoff.folder is None else str(handoff.folder),
            "control_plane": control_plane, "engine_records": bool(control_plane and ingest_key),
            "fleet_tenant": None if agent is None else agent.tenant,
            "ready_port": ready_port, "kubernetes_relabel": kubernetes_relabel,
        }  # fmt: skip
        typer.echo(json.dumps(plan, indent=2))
        return
    run_sim_worker(spec, agent, relabeler=relabeler)
