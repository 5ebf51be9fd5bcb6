"""What a gateway is started with: upstreams, control plane, keys, timeouts."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from exporters.fleet import PoolRole
from serving.gateway.engine_priority import EnginePriority
from serving.gateway.kubernetes import DEFAULT_SELECTOR
from serving.gateway.pool import StaticInstance

__all__ = ["GatewayConfig", "GatewayConfigError", "KVHandoff", "PoolSource"]


class PoolSource(StrEnum):
    """Where the gateway learns its pools' members (besides the command line's).

    ``FLEET``: the control plane's fleet registry (``--control-plane``). ``KUBERNETES``: the
    worker pods' ``goodput.dev/role`` label, watched on the API server
    (:mod:`serving.gateway.kubernetes`); the fleet-registry sync is then off, since two
    membership sources would drop each other's members.
    """

    FLEET = "fleet"
    KUBERNETES = "kubernetes"


class KVHandoff(StrEnum):
    """How a decode instance learns that its prompt's KV cache was computed by a prefill one.

    ``FOLDER``: ExampleConnector over a shared folder; the decode leg is the client's body
    and the decode instance finds the prompt's KV by its tokens. ``PARAMS``: NixlConnector's
    protocol; the prefill leg asks for ``do_remote_decode`` and the decode leg carries the
    ``kv_transfer_params`` the prefill instance answered with (where to pull the blocks).
    """

    FOLDER = "folder"
    PARAMS = "params"


class GatewayConfigError(ValueError):
    """A configuration value that cannot work; the message names the option and the value."""


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """The gateway's configuration (``goodput gateway --help`` documents each option).

    Modes: PD (``prefill`` and ``decode`` given, or learnt from the fleet registry) or
    colocated (``colocated`` given: one pool, each request served whole by one instance).
    ``api_keys`` maps a client API key to its tenant; when it is empty the gateway accepts
    any key (or none) and labels requests with ``default_tenant``. With a control plane,
    ``agent_key`` registers the gateway in the fleet, ``ingest_key`` ships its records and
    ``viewer_key`` (default: ``agent_key``) reads the fleet registry. ``fleet_tenant``: the
    tenant whose pool the gateway serves, sent when it registers (``None``: the cluster's).

    Timeouts: ``connect_timeout_s`` to open a connection; ``prefill_timeout_s`` for the
    whole prefill call; ``first_token_timeout_s`` until the decode instance answers;
    ``chunk_timeout_s`` between two chunks of a stream. Every upstream call has one.
    ``command_poll_s``: how often the gateway polls its commands (with ``agent_key``).

    ``pools_from``: the membership source (:class:`PoolSource`). With ``kubernetes``: the
    pods of ``kubernetes_namespace`` (default: the service account's) matching
    ``kubernetes_selector``, served at ``http://POD_IP:worker_port``, through the API
    server at ``kubernetes_api`` (default: in-cluster, from the service account).

    ``kv_handoff``: the KV hand-off protocol of the PD pools (:class:`KVHandoff`; it must
    match the workers' connector: ``folder`` for ExampleConnector, ``params`` for
    NixlConnector). Colocated mode has no hand-off and ignores it.

    ``engine_priority``: the request's class sent to the engines as vLLM's ``priority``
    (:mod:`serving.gateway.engine_priority`): ``off``, ``policy`` (the admission policy's
    class order) or ``CLASS=N,…[,*=N]``; the engines must run ``--scheduling-policy
    priority`` for it to change their order.
    """

    prefill: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()
    colocated: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    port: int = 8080
    control_plane: str | None = None
    agent_key: str | None = None
    ingest_key: str | None = None
    viewer_key: str | None = None
    gateway_id: str = field(default_factory=lambda: f"gateway-{uuid.uuid4().hex[:8]}")
    fleet_tenant: str | None = None
    api_keys: Mapping[str, str] = field(default_factory=dict)
    default_tenant: str = ""
    connect_timeout_s: float = 2.0
    prefill_timeout_s: float = 120.0
    first_token_timeout_s: float = 120.0
    chunk_timeout_s: float = 60.0
    cooldown_s: float = 5.0
    fleet_refresh_s: float = 5.0
    heartbeat_s: float = 10.0
    command_poll_s: float = 1.0
    max_connections: int = 512
    record_flush_interval_s: float = 0.25
    kv_handoff: KVHandoff = KVHandoff.FOLDER
    pools_from: PoolSource = PoolSource.FLEET
    kubernetes_namespace: str = ""
    kubernetes_selector: str = DEFAULT_SELECTOR
    kubernetes_api: str | None = None
    worker_port: int = 8000
    engine_priority: str = "off"

    def __post_init__(self) -> None:
        try:
            EnginePriority.parse(self.engine_priority)
        except ValueError as exc:
            raise GatewayConfigError(f"--engine-priority: {exc}") from None
        try:
            object.__setattr__(self, "pools_from", PoolSource(self.pools_from))
        except ValueError:
            allowed = ", ".join(repr(k.value) for k in PoolSource)
            raise GatewayConfigError(
                f"pools_from must be one of {allowed}, got {self.pools_from!r}"
            ) from None
        watch = self.pools_from is PoolSource.KUBERNETES
        if not 1 <= self.worker_port <= 65535:
            raise GatewayConfigError(f"worker_port must be in 1..65535, got {self.worker_port}")
        if watch and not self.kubernetes_selector.strip():
            raise GatewayConfigError("--kubernetes-selector must not be empty")
        if self.kubernetes_api and not self.kubernetes_api.startswith(("http://", "https://")):
            raise GatewayConfigError(
                f"--kubernetes-api must start with http:// or https://, got {self.kubernetes_api!r}"
            )
        try:
            object.__setattr__(self, "kv_handoff", KVHandoff(self.kv_handoff))
        except ValueError:
            allowed = ", ".join(repr(k.value) for k in KVHandoff)
            raise GatewayConfigError(
                f"kv_handoff must be one of {allowed}, got {self.kv_handoff!r}"
            ) from None
        if self.colocated and (self.prefill or self.decode):
            raise GatewayConfigError(
                "--colocated cannot be combined with --prefill/--decode: colocated mode has "
                f"one pool (got colocated={list(self.colocated)}, prefill={list(self.prefill)}, "
                f"decode={list(self.decode)})"
            )
        if not (self.prefill or self.decode or self.colocated or self.control_plane or watch):
            raise GatewayConfigError(
                "no upstream: give --prefill and --decode URLs, --colocated URLs, or "
                "--control-plane to learn them from the fleet registry (or "
                "--pools-from=kubernetes: from the worker pods' labels)"
            )
        if bool(self.prefill) != bool(self.decode) and not (self.control_plane or watch):
            raise GatewayConfigError(
                "PD mode needs both pools: got "
                f"{len(self.prefill)} --prefill and {len(self.decode)} --decode URLs"
            )
        for name in (
            "connect_timeout_s",
            "prefill_timeout_s",
            "first_token_timeout_s",
            "chunk_timeout_s",
            "fleet_refresh_s",
            "heartbeat_s",
            "command_poll_s",
            "record_flush_interval_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise GatewayConfigError(f"{name} must be a finite number > 0, got {value!r}")
        if self.cooldown_s < 0:
            raise GatewayConfigError(f"cooldown_s must be >= 0, got {self.cooldown_s}")
        if self.max_connections < 1:
            raise GatewayConfigError(f"max_connections must be >= 1, got {self.max_connections}")
        if not 0 <= self.port <= 65535:
            raise GatewayConfigError(f"port must be in 0..65535, got {self.port}")
        if self.control_plane and not self.control_plane.startswith(("http://", "https://")):
            raise GatewayConfigError(
                f"--control-plane must start with http:// or https://, got {self.control_plane!r}"
            )

    @property
    def fleet_sync(self) -> bool:
        """Whether the pools follow the fleet registry (a control plane, and no watcher)."""
        return bool(self.control_plane) and self.pools_from is PoolSource.FLEET

    @property
    def colocated_mode(self) -> bool:
        return bool(self.colocated)

    def static_instances(self) -> list[StaticInstance]:
        return [
            *(StaticInstance(url, PoolRole.PREFILL) for url in self.prefill),
            *(StaticInstance(url, PoolRole.DECODE) for url in self.decode),
            *(StaticInstance(url, PoolRole.BOTH) for url in self.colocated),
        ]
