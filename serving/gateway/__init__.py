"""The PD gateway: an OpenAI-compatible proxy in front of prefill and decode instances.

It admits (``admission``), routes (``routing.choose``, pure), sends the prompt to a prefill
instance with ``max_tokens=1``, then the request to a decode instance, relays the stream
chunk by chunk and records every chunk with the exporters' recorder (``relay``); pools come
from the command line and the control plane's fleet registry (``pool``, ``control``).
See docs/gateway.md.
"""

from exporters.fleet import PoolRole
from serving.gateway.admission import ADMIT, AdmissionHook, AllowAll, Decision, RequestInfo
from serving.gateway.config import GatewayConfig, GatewayConfigError
from serving.gateway.pool import InstancePool, StaticInstance
from serving.gateway.routing import (
    InstanceState,
    NoInstanceError,
    RouteDecision,
    RouteRequest,
    affinity_key,
    choose,
)
from serving.gateway.service import create_app
from serving.gateway.state import Gateway

__all__ = [
    "ADMIT",
    "AdmissionHook",
    "AllowAll",
    "Decision",
    "Gateway",
    "GatewayConfig",
    "GatewayConfigError",
    "InstancePool",
    "InstanceState",
    "NoInstanceError",
    "PoolRole",
    "RequestInfo",
    "RouteDecision",
    "RouteRequest",
    "StaticInstance",
    "affinity_key",
    "choose",
    "create_app",
]
