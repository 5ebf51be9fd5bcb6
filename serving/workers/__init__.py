"""Workers: launch and supervise vLLM servers, manage the shared KV folder, talk to the
control plane as an agent. See docs/serving.md.

The vLLM-side piece (:mod:`serving.workers.kv_connector`) is imported by vLLM itself and is
not re-exported here: importing this package never imports vLLM or torch.
"""

from serving.workers.agent import Agent, AgentReport, AgentSettings, AgentStats
from serving.workers.backoff import RestartBackoff
from serving.workers.commands import WORKER_COMMAND_KINDS, CommandExecutor
from serving.workers.config import (
    Device,
    LaunchPlan,
    SpecError,
    VllmSpec,
    build_kv_transfer_config,
    build_launch,
)
from serving.workers.kv_folder import (
    GCResult,
    KVFolder,
    KVFolderPolicy,
    KVFolderStatus,
    check_safetensors,
    expected_layer_files,
    plan_gc,
)
from serving.workers.launcher import ServerError, VllmServer
from serving.workers.load import WorkerLoad, metric_sum, parse_load
from serving.workers.readiness import ReadinessServer
from serving.workers.relabel import PodRelabeler, relabelling
from serving.workers.supervisor import (
    SupervisorSettings,
    WorkerStatus,
    WorkerSupervisor,
)

__all__ = [
    "WORKER_COMMAND_KINDS",
    "Agent",
    "AgentReport",
    "AgentSettings",
    "AgentStats",
    "CommandExecutor",
    "Device",
    "GCResult",
    "KVFolder",
    "KVFolderPolicy",
    "KVFolderStatus",
    "LaunchPlan",
    "PodRelabeler",
    "ReadinessServer",
    "RestartBackoff",
    "ServerError",
    "SpecError",
    "SupervisorSettings",
    "VllmServer",
    "VllmSpec",
    "WorkerLoad",
    "WorkerStatus",
    "WorkerSupervisor",
    "build_kv_transfer_config",
    "build_launch",
    "check_safetensors",
    "expected_layer_files",
    "metric_sum",
    "parse_load",
    "plan_gc",
    "relabelling",
]
