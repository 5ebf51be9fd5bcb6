"""The down contract: commands from the control plane to gateways and workers, and their acks.

Commands are rare (a policy push, a role change), so they travel as JSON objects, validated
field by field with errors that name the field, the value and what is allowed. The admission
policy a ``set_admission_policy`` command carries is defined in :mod:`exporters.admission`
(re-exported here).

Delivery and ordering: a command carries a random ``id`` (a UUID) and a ``version``. The
sender may deliver a command more than once; the target applies an ``id`` at most once and
acknowledges every delivery. ``version`` is the desired-state version of ``(target, kind)``,
non-decreasing per control plane: a target ignores a command whose version is lower than the
last it applied for that kind, so a late duplicate cannot undo a newer decision. A command
past ``expires_time_ns`` is not applied (acked with ``ok=False``).

Example::

    policy = AdmissionPolicy(version=3, ttl_s=30.0, fallback_max_concurrency=64,
                             classes={"batch": ClassPolicy(shed_order=0),
                                      "interactive": ClassPolicy(shed_order=1, ttft_s=0.5)})
    cmd = Command.new(CommandKind.SET_ADMISSION_POLICY, "gateway-0", {"policy": policy},
                      version=3, now_ns=time.time_ns(), ttl_s=60.0)
    assert command_from_json(json.loads(json.dumps(command_to_json(cmd)))) == cmd
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from exporters._wire_fields import (
    COMMAND_VERSION,
    SUPPORTED_COMMAND_VERSIONS,
    CommandError,
    check_bool,
    check_enum,
    check_fields,
    check_int,
    check_name,
    check_seconds,
    check_uuid,
    check_v,
)
from exporters.admission import AdmissionModel, AdmissionPolicy, ClassPolicy, SLOAdmission
from exporters.fleet import PoolRole

__all__ = [
    "COMMAND_VERSION",
    "SUPPORTED_COMMAND_VERSIONS",
    "AdmissionModel",
    "AdmissionPolicy",
    "ClassPolicy",
    "Command",
    "CommandAck",
    "CommandError",
    "CommandKind",
    "Pool",
    "SLOAdmission",
    "command_from_json",
    "command_to_json",
    "pending_commands_from_json",
]

MAX_DETAIL_CHARS = 4096


class CommandKind(StrEnum):
    SET_ADMISSION_POLICY = "set_admission_policy"  # to a gateway
    SET_ROLE = "set_role"  # to a worker: which pool(s) it serves
    SET_POOL_MEMBERSHIP = "set_pool_membership"  # to a gateway: the instances of a pool
    DRAIN = "drain"  # to a worker or gateway: finish in-flight work, take no new requests
    RESUME = "resume"  # undo DRAIN


class Pool(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


def _payload(kind: CommandKind, payload: Any) -> Mapping[str, Any]:
    """Validate ``payload`` for ``kind`` and return its canonical, read-only form."""
    if not isinstance(payload, Mapping):
        raise CommandError("payload", f"expected an object, got {payload!r}")
    payload = dict(payload)
    if kind is CommandKind.SET_ROLE:
        payload = check_fields(payload, "payload", ("role",))
        result: dict[str, Any] = {"role": check_enum(payload["role"], "payload.role", PoolRole)}
    elif kind is CommandKind.SET_POOL_MEMBERSHIP:
        payload = check_fields(payload, "payload", ("pool", "instances"))
        instances = payload["instances"]
        if not isinstance(instances, list | tuple):
            raise CommandError(
                "payload.instances", f"expected a list of endpoint strings, got {instances!r}"
            )
        for endpoint in instances:
            check_name(endpoint, "payload.instances")
        if len(set(instances)) != len(instances):
            duplicate = next(e for e in instances if instances.count(e) > 1)
            raise CommandError("payload.instances", f"duplicate endpoint {duplicate!r}")
        result = {
            "pool": check_enum(payload["pool"], "payload.pool", Pool),
            "instances": tuple(instances),
        }
    elif kind is CommandKind.SET_ADMISSION_POLICY:
        payload = check_fields(payload, "payload", ("policy",))
        policy = payload["policy"]
        if not isinstance(policy, AdmissionPolicy):
            policy = AdmissionPolicy.from_json(policy, "payload.policy")
        result = {"policy": policy.to_json()}
    else:  # DRAIN, RESUME
        check_fields(payload, "payload", ())
        result = {}
    return MappingProxyType(result)


@dataclass(frozen=True, slots=True)
class Command:
    """One instruction to one target (a gateway id or a worker endpoint).

    ``payload`` per kind: ``SET_ROLE`` ``{"role": PoolRole}``; ``SET_POOL_MEMBERSHIP``
    ``{"pool": Pool, "instances": (endpoint, ...)}``; ``SET_ADMISSION_POLICY``
    ``{"policy": AdmissionPolicy.to_json()}`` (an :class:`AdmissionPolicy` is accepted and
    converted); ``DRAIN`` and ``RESUME`` ``{}``. Construction validates everything and stores
    the payload in that canonical, read-only form. Raises :class:`CommandError`.
    """

    id: str
    kind: CommandKind
    target: str
    version: int
    issued_time_ns: int
    expires_time_ns: int
    payload: Mapping[str, Any]

    def __post_init__(self) -> None:
        check_uuid(self.id, "id")
        kind = check_enum(self.kind, "kind", CommandKind)
        check_name(self.target, "target")
        check_int(self.version, "version")
        check_int(self.issued_time_ns, "issued_time_ns")
        check_int(self.expires_time_ns, "expires_time_ns")
        if self.expires_time_ns <= self.issued_time_ns:
            raise CommandError(
                "expires_time_ns",
                f"must be after issued_time_ns ({self.issued_time_ns}), got {self.expires_time_ns}",
            )
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "payload", _payload(kind, self.payload))

    @classmethod
    def new(
        cls,
        kind: CommandKind,
        target: str,
        payload: Mapping[str, Any],
        *,
        version: int,
        now_ns: int,
        ttl_s: float,
    ) -> Command:
        """A command with a fresh random id, issued at ``now_ns``, valid for ``ttl_s``."""
        expires = now_ns + round(check_seconds(ttl_s, "ttl_s") * 1e9)
        return cls(str(uuid.uuid4()), kind, target, version, now_ns, expires, payload)

    def expired(self, now_ns: int) -> bool:
        return now_ns >= self.expires_time_ns

    def admission_policy(self) -> AdmissionPolicy:
        """The policy a ``SET_ADMISSION_POLICY`` command carries."""
        if self.kind is not CommandKind.SET_ADMISSION_POLICY:
            raise CommandError("kind", f"{self.kind.value} carries no admission policy")
        return AdmissionPolicy.from_json(self.payload["policy"], "payload.policy")


COMMAND_FIELDS: tuple[str, ...] = (
    "v",
    "id",
    "kind",
    "target",
    "version",
    "issued_time_ns",
    "expires_time_ns",
    "payload",
)


def command_to_json(cmd: Command) -> dict[str, Any]:
    """The JSON object of a command (``json.dumps``-ready)."""
    payload = dict(cmd.payload)
    if "instances" in payload:
        payload["instances"] = list(payload["instances"])
    return {
        "v": COMMAND_VERSION,
        "id": cmd.id,
        "kind": cmd.kind.value,
        "target": cmd.target,
        "version": cmd.version,
        "issued_time_ns": cmd.issued_time_ns,
        "expires_time_ns": cmd.expires_time_ns,
        "payload": {k: v.value if isinstance(v, StrEnum) else v for k, v in payload.items()},
    }


def command_from_json(obj: Any) -> Command:
    """A command from its parsed JSON object. Raises :class:`CommandError`."""
    obj = check_fields(check_v(obj, "command"), "command", COMMAND_FIELDS, top_level=True)
    return Command(
        id=obj["id"],
        kind=obj["kind"],
        target=obj["target"],
        version=obj["version"],
        issued_time_ns=obj["issued_time_ns"],
        expires_time_ns=obj["expires_time_ns"],
        payload=obj["payload"],
    )


ACK_FIELDS: tuple[str, ...] = ("v", "command_id", "target", "ok", "detail", "acked_time_ns")


@dataclass(frozen=True, slots=True)
class CommandAck:
    """A target's answer to one delivery of a command: applied (``ok``) or why not."""

    command_id: str
    target: str
    ok: bool
    detail: str
    acked_time_ns: int

    def __post_init__(self) -> None:
        check_uuid(self.command_id, "command_id")
        check_name(self.target, "target")
        check_bool(self.ok, "ok")
        if not isinstance(self.detail, str) or len(self.detail) > MAX_DETAIL_CHARS:
            raise CommandError(
                "detail", f"must be a string of at most {MAX_DETAIL_CHARS} characters"
            )
        check_int(self.acked_time_ns, "acked_time_ns")

    def to_json(self) -> dict[str, Any]:
        return {
            "v": COMMAND_VERSION,
            "command_id": self.command_id,
            "target": self.target,
            "ok": self.ok,
            "detail": self.detail,
            "acked_time_ns": self.acked_time_ns,
        }

    @classmethod
    def from_json(cls, obj: Any) -> CommandAck:
        obj = check_fields(check_v(obj, "ack"), "ack", ACK_FIELDS, top_level=True)
        return cls(obj["command_id"], obj["target"], obj["ok"], obj["detail"], obj["acked_time_ns"])


def pending_commands_from_json(obj: Any) -> tuple[list[Command], list[CommandError]]:
    """The commands of a poll's answer (``GET /api/v1/fleet/{id}/commands``:
    ``{"data": [command, ...], "count": n}``), and one :class:`CommandError` per item that
    breaks the contract (without a valid id there is nothing to acknowledge: the control
    plane expires it). Raises :class:`CommandError` when the answer itself is malformed."""
    if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
        raise CommandError("data", f"expected an object with a list under 'data', got {obj!r:.80}")
    commands: list[Command] = []
    errors: list[CommandError] = []
    for item in obj["data"]:
        try:
            commands.append(command_from_json(item))
        except CommandError as exc:
            errors.append(exc)
    return commands, errors
