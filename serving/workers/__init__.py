"""Workers: launch and supervise vLLM servers, manage the shared KV folder, talk to the
control plane as an agent. See docs/serving.md.

The vLLM-side pieces (:mod:`serving.workers.kv_connector`) are imported by vLLM itself and
are not re-exported here: importing this package never imports vLLM or torch.
"""

from serving.workers.config import (
    Device,
    LaunchPlan,
    SpecError,
    VllmSpec,
    build_kv_transfer_config,
    build_launch,
)
from serving.workers.launcher import ServerError, VllmServer

__all__ = [
    "Device",
    "LaunchPlan",
    "ServerError",
    "SpecError",
    "VllmServer",
    "VllmSpec",
    "build_kv_transfer_config",
    "build_launch",
]
