"""How one vLLM OpenAI server is launched: the command line and environment, in one code path.

:class:`VllmSpec` says what to run (model, port, device, core, shared KV folder);
:func:`build_launch` turns it into a :class:`LaunchPlan` (argv + env) and nothing else looks
at the device to decide anything. The KV connector follows the device:

* ``Device.CPU`` with a ``kv_dir``: vLLM's ``ExampleConnector`` (KV through a shared folder),
  by default through our :mod:`serving.workers.kv_connector` subclass that publishes each
  prompt's folder atomically (``atomic_kv=True``; the on-disk layout is ExampleConnector's);
* ``Device.CUDA``: ``NixlConnector`` (the production GPU path; the gateway passes
  ``kv_transfer_params`` between the two legs). It is built here but cannot run on this CPU
  machine;
* no ``kv_dir`` on the CPU: no connector (a colocated instance).

Every instance with a connector starts with ``kv_role`` ``kv_both``: whether it prefills or
decodes is the gateway's routing decision, changeable without a restart.

Example::

    spec = VllmSpec(model=Path("var/models/tiny-llama"), port=8100, cpu=0,
                    kv_dir=Path("var/kv"))
    plan = build_launch(spec, run_dir=Path("var/run/worker-8100"))
    subprocess.Popen(plan.argv, env=plan.env)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from serving.process import dies_with_parent
from serving.workers.priority import MAX_NICE

__all__ = [
    "ATOMIC_CONNECTOR_CLASS",
    "ATOMIC_CONNECTOR_MODULE",
    "SCHEDULING_POLICIES",
    "Device",
    "LaunchPlan",
    "SpecError",
    "VllmSpec",
    "build_kv_transfer_config",
    "build_launch",
]

ATOMIC_CONNECTOR_MODULE = "serving.workers.kv_connector"
ATOMIC_CONNECTOR_CLASS = "AtomicExampleConnector"
# What vLLM needs on a machine with no network (shared/notes/vllm-cpu.md).
_OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


#: vLLM's ``--scheduling-policy`` values.
SCHEDULING_POLICIES = ("fcfs", "priority")


class SpecError(ValueError):
    """A launch spec that cannot work; the message names the field, the value and the rule."""


class Device(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True, slots=True)
class VllmSpec:
    """One vLLM OpenAI-compatible server.

    ``cpu`` is the core the engine's OpenMP threads bind to on the CPU
    (``VLLM_CPU_OMP_THREADS_BIND``; ``None`` lets vLLM choose), or the GPU index on CUDA
    (``CUDA_VISIBLE_DEVICES``). ``kv_cache_gib`` is the CPU KV cache size
    (``VLLM_CPU_KVCACHE_SPACE``). ``enforce_eager`` skips torch.compile: 30–35 s to ready
    instead of 75–80 s on this machine kind, which matters more than step time for the tiny
    model. ``engine_env`` is added to the server's environment (for example the stat-logger
    plugin's ``GOODPUT_CONTROL_PLANE_URL`` / ``GOODPUT_INGEST_KEY``); ``extra_args`` is
    appended to its command line. ``nice`` (0..19) runs the server, once ready, at a lower
    CPU priority (its niceness and, on Linux, its session's autogroup:
    :mod:`serving.workers.priority`), so that an engine sharing cores with the gateway and
    clients does not delay them; ``sched_idle`` also puts it under ``SCHED_IDLE`` (Linux),
    which shortens their waits further (not to zero across sessions: docs/serving.md).
    ``scheduling_policy``: vLLM's ``--scheduling-policy`` (``fcfs``, vLLM's default, or
    ``priority``: waiting requests served by the body's ``priority``, lower first, which
    the gateway's ``--engine-priority`` sets from the request's class); ``None`` leaves the
    flag out. ``chunked_prefill``: vLLM's ``--enable-chunked-prefill`` (``True``) or
    ``--no-enable-chunked-prefill`` (``False``); ``None`` leaves vLLM's default (on, on
    the CPU). Off, a step prefills whole prompts only (``max_model_len`` must fit in its
    token budget): a prompt is never split across steps, so the shared-folder connector
    publishes every prompt (a chunked one is not published, and its decode instance
    computes it again: :mod:`serving.workers.kv_connector`), and a request at a higher
    priority waits for at most the step being run, never for the rest of a lower one's
    chunks nor shares its own step with them (docs/admission.md, "Engine priorities").
    """

    model: Path
    port: int
    host: str = "127.0.0.1"
    device: Device = Device.CPU
    kv_dir: Path | None = None
    cpu: int | None = None
    served_model_name: str | None = None
    max_model_len: int = 2048
    max_num_seqs: int | None = None
    kv_cache_gib: int = 1
    enforce_eager: bool = True
    atomic_kv: bool = True
    nixl_side_channel_port: int | None = None
    engine_env: Mapping[str, str] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    nice: int = 0
    sched_idle: bool = False
    scheduling_policy: str | None = None
    chunked_prefill: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", _device(self.device))
        if not 1 <= self.port <= 65535:
            raise SpecError(f"port must be in 1..65535, got {self.port}")
        if self.cpu is not None and self.cpu < 0:
            raise SpecError(f"cpu must be >= 0 (a core or GPU index), got {self.cpu}")
        if self.max_model_len < 16:
            raise SpecError(f"max_model_len must be >= 16, got {self.max_model_len}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise SpecError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.kv_cache_gib < 1:
            raise SpecError(f"kv_cache_gib must be >= 1, got {self.kv_cache_gib}")
        if self.device is Device.CUDA and self.kv_dir is not None:
            raise SpecError(
                f"kv_dir is for the CPU's shared-folder connector; on cuda the KV goes through "
                f"NixlConnector, got kv_dir={str(self.kv_dir)!r}"
            )
        if not 0 <= self.nice <= MAX_NICE:
            raise SpecError(
                f"nice must be in 0..{MAX_NICE} (a lower CPU priority for the engine), "
                f"got {self.nice}"
            )
        if self.scheduling_policy is not None and self.scheduling_policy not in SCHEDULING_POLICIES:
            raise SpecError(
                f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got "
                f"{self.scheduling_policy!r}"
            )
        port = self.nixl_side_channel_port
        if port is not None and not 1 <= port <= 65535:
            raise SpecError(f"nixl_side_channel_port must be in 1..65535, got {port}")

    @property
    def url(self) -> str:
        """The server's base URL (``http://host:port``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def model_name(self) -> str:
        """The model name clients send (``--served-model-name``, else the folder's name)."""
        return self.served_model_name or self.model.name


def _device(value: object) -> Device:
    try:
        return Device(str(value))
    except ValueError:
        allowed = ", ".join(d.value for d in Device)
        raise SpecError(f"device must be one of {allowed}, got {value!r}") from None


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """What to execute: ``argv`` and the full environment ``env``."""

    argv: list[str]
    env: dict[str, str]


def build_kv_transfer_config(spec: VllmSpec) -> dict[str, Any] | None:
    """The ``--kv-transfer-config`` object for ``spec`` (``None``: no connector)."""
    if spec.device is Device.CUDA:
        return {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    if spec.kv_dir is None:
        return None
    config: dict[str, Any] = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(spec.kv_dir.resolve())},
    }
    if spec.atomic_kv:
        config["kv_connector"] = ATOMIC_CONNECTOR_CLASS
        config["kv_connector_module_path"] = ATOMIC_CONNECTOR_MODULE
    return config


def build_launch(
    spec: VllmSpec,
    *,
    run_dir: Path,
    python: str | None = None,
    base_env: Mapping[str, str] | None = None,
    parent_pid: int | None = None,
    rpc_dir: Path | None = None,
) -> LaunchPlan:
    """The command line and environment that start ``spec``'s server.

    ``run_dir`` holds the instance's own ``tmp`` (``TMPDIR``: vLLM's IPC sockets and
    ``vllm_dist_*`` files) and ``cache`` (``VLLM_CACHE_ROOT``: compile caches), so that
    instances never share them and nothing lands in ``/tmp`` or ``~/.cache``. ``python`` is
    the interpreter (default: this one); ``base_env`` the inherited environment (default:
    ``os.environ``). ``rpc_dir`` is where vLLM puts its IPC sockets (default
    ``run_dir/tmp``). With ``parent_pid`` the command is run through the exec wrapper
    (:func:`serving.process.dies_with_parent`), which makes the server die with that process
    and execs vLLM (same pid). ``spec.nice`` is not in the plan: the launcher applies it once
    the server is ready. Pure: creates nothing.
    """
    env = dict(os.environ if base_env is None else base_env)
    env.update(_OFFLINE_ENV)
    env["TMPDIR"] = str(run_dir / "tmp")
    # vLLM's ZMQ IPC sockets (default: TMPDIR); the launcher passes a shorter folder when
    # run_dir is too deep for a Unix socket path.
    env["VLLM_RPC_BASE_PATH"] = str(rpc_dir or run_dir / "tmp")
    env["VLLM_CACHE_ROOT"] = str(run_dir / "cache")
    if spec.device is Device.CPU:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_gib)
        env["VLLM_CPU_OMP_THREADS_BIND"] = "auto" if spec.cpu is None else str(spec.cpu)
    else:
        if spec.cpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(spec.cpu)
        if spec.nixl_side_channel_port is not None:
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = spec.host
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(spec.nixl_side_channel_port)
    env.update(spec.engine_env)

    # `python -m ...`: the `vllm` console script fails for the `vllm-cpu` distribution.
    argv = [
        python or sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(spec.model.resolve()),  # the server runs in run_dir: no relative paths
        "--served-model-name",
        spec.model_name,
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--max-model-len",
        str(spec.max_model_len),
        "--disable-uvicorn-access-log",
    ]
    if spec.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(spec.max_num_seqs)]
    if spec.enforce_eager:
        argv.append("--enforce-eager")
    if spec.scheduling_policy is not None:
        argv += ["--scheduling-policy", spec.scheduling_policy]
    if spec.chunked_prefill is not None:
        argv.append(
            "--enable-chunked-prefill" if spec.chunked_prefill else "--no-enable-chunked-prefill"
        )
    kv_config = build_kv_transfer_config(spec)
    if kv_config is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_config, separators=(",", ":"))]
    argv += list(spec.extra_args)
    if parent_pid is not None:
        argv = dies_with_parent(argv, parent_pid=parent_pid, python=python)
    return LaunchPlan(argv=argv, env=env)
