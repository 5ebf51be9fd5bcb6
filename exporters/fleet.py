"""The fleet contract: how gateways and workers register with the control plane, beat, read
the fleet, and fetch their commands; and the pool role, defined once for every component.

Routes (the control plane's ``/api/v1/fleet``; registering and beating need an ``agent``
key, reading the fleet a ``viewer`` one):

* ``POST /api/v1/fleet/register`` — :class:`FleetRegister`; registering again updates the
  entry (a worker registers again when its role changes: the heartbeat carries none);
* ``POST /api/v1/fleet/{id}/heartbeat`` — :class:`FleetHeartbeat`; a 404 means the control
  plane forgot the member, which then registers again;
* ``GET /api/v1/fleet?kind=worker&limit=&offset=`` — a page of :class:`FleetMember`
  (:meth:`FleetPage.from_json`);
* ``GET /api/v1/fleet/{id}/commands`` — the member's pending commands
  (:func:`exporters.commands.pending_commands_from_json`), each acknowledged with
  ``POST /api/v1/fleet/{id}/commands/{command_id}/ack`` (:class:`~exporters.commands.CommandAck`).

The messages are plain dataclasses with ``to_json``/``from_json``; the control plane's
pydantic schemas (``controlplane.schemas.fleet``) validate the same fields at its edge, with
these enums. A decoder raises :class:`FleetError` naming the field.

Example::

    body = FleetRegister(id="gw-0", kind=FleetKind.GATEWAY, endpoint="http://10.0.0.2:8080",
                         role=PoolRole.BOTH, state=FleetState.READY).to_json()
    page = FleetPage.from_json(client.get(f"{FLEET_PATH}?kind=worker").json())
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from exporters._wire_schema import WireError

__all__ = [
    "FLEET_PATH",
    "OFFERED_RPS",
    "FleetError",
    "FleetHeartbeat",
    "FleetKind",
    "FleetMember",
    "FleetPage",
    "FleetRegister",
    "FleetState",
    "LoadValue",
    "PoolRole",
]

FLEET_PATH = "/api/v1/fleet"

#: A load report's values: flat, for the planner to read (``num_requests_running``, ...).
LoadValue = bool | int | float | str
#: The load key a gateway reports its offered requests per second under; the control
#: plane weighs each gateway's share of the admission budget by it.
OFFERED_RPS = "offered_rps"


class FleetKind(StrEnum):
    GATEWAY = "gateway"
    WORKER = "worker"


class PoolRole(StrEnum):
    """Which pool an instance serves (a gateway reports ``both``)."""

    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"


class FleetState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    DRAINED = "drained"
    DOWN = "down"


class FleetError(WireError):
    """A fleet message that breaks the contract; ``str(e) == f"{field}: {reason}"``."""


E = TypeVar("E", bound=StrEnum)


def _enum(obj: Mapping[str, Any], key: str, enum: type[E], path: str) -> E:
    try:
        return enum(obj[key])
    except KeyError:
        raise FleetError(f"{path}.{key}", "missing") from None
    except ValueError:
        raise FleetError(
            f"{path}.{key}", f"unknown value {obj[key]!r}; allowed: {[e.value for e in enum]}"
        ) from None


def _text(obj: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise FleetError(f"{path}.{key}", f"must be a string, got {value!r}")
    return value


def _object(obj: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise FleetError(path, f"expected a JSON object, got {type(obj).__name__}")
    return obj


@dataclass(frozen=True, slots=True)
class FleetRegister:
    """A gateway or worker announcing itself (``POST /api/v1/fleet/register``).
    ``tenant``: the tenant whose pool it serves (its tenant-scoped keys see and command
    it); ``None``, the default, makes it the cluster's, shared. Sent only when set, so a
    control plane that predates tenancy still takes the registration."""

    id: str
    kind: FleetKind
    endpoint: str
    model: str = ""
    role: PoolRole = PoolRole.BOTH
    state: FleetState = FleetState.STARTING
    load: Mapping[str, LoadValue] = field(default_factory=dict)
    tenant: str | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind.value,
            "endpoint": self.endpoint,
            "model": self.model,
            "role": self.role.value,
            "state": self.state.value,
            "load": dict(self.load),
        }
        if self.tenant is not None:
            body["tenant"] = self.tenant
        return body


@dataclass(frozen=True, slots=True)
class FleetHeartbeat:
    """Liveness plus the latest load; ``state`` changes the reported state when given."""

    state: FleetState | None = None
    load: Mapping[str, LoadValue] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"load": dict(self.load)}
        if self.state is not None:
            body["state"] = self.state.value
        return body


@dataclass(frozen=True, slots=True)
class FleetMember:
    """One member as the fleet list shows it; ``stale``: no heartbeat within the control
    plane's heartbeat timeout. Decoding ignores the fields a reader does not need
    (``last_heartbeat_at``, ``registered_at``)."""

    id: str
    kind: FleetKind
    endpoint: str
    role: PoolRole
    state: FleetState
    model: str = ""
    load: Mapping[str, Any] = field(default_factory=dict)
    stale: bool = False
    tenant: str | None = None

    @classmethod
    def from_json(cls, obj: Any, path: str = "member") -> FleetMember:
        obj = _object(obj, path)
        load = obj.get("load", {})
        stale = obj.get("stale", False)
        tenant = obj.get("tenant")
        if not isinstance(load, Mapping):
            raise FleetError(f"{path}.load", f"must be an object, got {load!r}")
        if not isinstance(stale, bool):
            raise FleetError(f"{path}.stale", f"must be true or false, got {stale!r}")
        if tenant is not None and not isinstance(tenant, str):
            raise FleetError(f"{path}.tenant", f"must be a string or null, got {tenant!r}")
        return cls(
            id=_text(obj, "id", path),
            kind=_enum(obj, "kind", FleetKind, path),
            endpoint=_text(obj, "endpoint", path),
            role=_enum(obj, "role", PoolRole, path),
            state=_enum(obj, "state", FleetState, path),
            model=_text(obj, "model", path, ""),
            load=dict(load),
            stale=stale,
            tenant=tenant,
        )


@dataclass(frozen=True, slots=True)
class FleetPage:
    """One page of the fleet list: its members that decode (``data``), the ones that did
    not (``invalid``: one :class:`FleetError` each), and the total count of the list."""

    data: tuple[FleetMember, ...]
    count: int
    invalid: tuple[FleetError, ...] = ()

    @property
    def size(self) -> int:
        """Members on this page, decodable or not (for paging by offset)."""
        return len(self.data) + len(self.invalid)

    @classmethod
    def from_json(cls, obj: Any) -> FleetPage:
        """A page from ``{"data": [member, ...], "count": n}``; a member that breaks the
        contract is set apart rather than failing the page."""
        obj = _object(obj, "page")
        items, count = obj.get("data"), obj.get("count")
        if not isinstance(items, list):
            raise FleetError("data", f"must be a list, got {items!r}")
        if type(count) is not int or count < 0:
            raise FleetError("count", f"must be an integer >= 0, got {count!r}")
        members: list[FleetMember] = []
        invalid: list[FleetError] = []
        for k, item in enumerate(items):
            try:
                members.append(FleetMember.from_json(item, f"data[{k}]"))
            except FleetError as exc:
                invalid.append(exc)
        return cls(tuple(members), count, tuple(invalid))
