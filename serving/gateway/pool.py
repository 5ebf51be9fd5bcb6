"""The gateway's view of its upstream instances: membership, live load, affinity.

:class:`InstancePool` merges two sources of membership:

* **static** instances from the command line (``--prefill``, ``--decode``,
  ``--colocated``), always members;
* the control plane's **fleet registry** (``GET /api/v1/fleet``, workers only), applied
  with :meth:`InstancePool.apply_fleet` by :class:`serving.gateway.control.ControlPlaneLink`.
  A fleet member with the endpoint of a static instance updates it (its role wins, and it
  is skipped while the fleet says it is ``draining``, ``drained`` or ``down``); others join
  and are eligible only when ``ready`` and not ``stale`` (a static instance the command line
  named is trusted while it is ``starting`` or its agent is late: a failed call cools it
  down anyway). When the control plane cannot be reached the pool keeps what it last knew.

It counts the work in flight on each instance (prompt tokens being prefilled, streams being
decoded), marks instances that failed as down for a cool-down, and keeps the prefix
affinity table (bounded, least recently used out). :meth:`states` snapshots all of it as
:class:`~serving.gateway.routing.InstanceState` for the pure router. Everything runs on
the gateway's event loop: no locks.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from exporters.fleet import FleetKind, FleetMember, FleetState, PoolRole
from serving.gateway.routing import InstanceState

__all__ = ["InstancePool", "StaticInstance"]

_STOPPED = frozenset({FleetState.DRAINING, FleetState.DRAINED, FleetState.DOWN})

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StaticInstance:
    """An instance named on the command line."""

    url: str
    role: PoolRole


@dataclass(slots=True)
class _Live:
    state: InstanceState
    static_role: PoolRole | None  # the command-line role of a static instance
    in_fleet: bool = False


class InstancePool:
    """Membership, load and affinity of the upstream instances (see the module docstring).

    ``cooldown_s`` is how long a failed instance is skipped; ``max_affinity_keys`` bounds
    the affinity table.
    """

    def __init__(
        self,
        static: Iterable[StaticInstance] = (),
        *,
        cooldown_s: float = 5.0,
        max_affinity_keys: int = 65_536,
    ) -> None:
        if cooldown_s < 0:
            raise ValueError(f"cooldown_s must be >= 0, got {cooldown_s}")
        if max_affinity_keys < 1:
            raise ValueError(f"max_affinity_keys must be >= 1, got {max_affinity_keys}")
        self.cooldown_s = cooldown_s
        self.max_affinity_keys = max_affinity_keys
        self._live: dict[str, _Live] = {}
        self.affinity: OrderedDict[str, tuple[str, str]] = OrderedDict()
        for inst in static:
            url = _normal_url(inst.url)
            if url in self._live:
                raise ValueError(f"instance {url!r} is given twice")
            self._live[url] = _Live(InstanceState(id=url, url=url, role=inst.role), inst.role)

    def __len__(self) -> int:
        return len(self._live)

    def states(self) -> list[InstanceState]:
        """A snapshot for :func:`~serving.gateway.routing.choose` (static ones first)."""
        return [live.state for live in self._live.values()]

    def get(self, instance_id: str) -> InstanceState | None:
        live = self._live.get(instance_id)
        return None if live is None else live.state

    # -- load --

    def add_load(
        self,
        instance_id: str,
        *,
        prefill_tokens: int = 0,
        decode_streams: int = 0,
        engine_priority: int = 0,
    ) -> None:
        """Add (or, with negative values, remove) in-flight work of an instance.
        ``engine_priority`` (the priority the work was sent to the engine with) is not kept
        here: admission's tracker counts it (``TrackedPool``)."""
        del engine_priority
        live = self._live.get(instance_id)
        if live is None:  # it left the fleet while the request ran
            return
        s = live.state
        live.state = replace(
            s,
            prefill_tokens=max(0, s.prefill_tokens + prefill_tokens),
            decode_streams=max(0, s.decode_streams + decode_streams),
        )

    def mark_down(self, instance_id: str, now_s: float) -> None:
        """The instance failed a request: skip it for ``cooldown_s``."""
        live = self._live.get(instance_id)
        if live is not None:
            live.state = replace(live.state, down_until_s=now_s + self.cooldown_s)

    def mark_up(self, instance_id: str) -> None:
        """The instance answered: end any cool-down early."""
        live = self._live.get(instance_id)
        if live is not None and live.state.down_until_s:
            live.state = replace(live.state, down_until_s=0.0)

    # -- affinity --

    def pin(self, key: str | None, prefill_id: str, decode_id: str) -> None:
        """Remember where ``key``'s prefix went (most recent use last)."""
        if key is None:
            return
        table = self.affinity
        table[key] = (prefill_id, decode_id)
        table.move_to_end(key)
        while len(table) > self.max_affinity_keys:
            table.popitem(last=False)

    # -- membership from the fleet registry --

    def apply_fleet(self, members: Iterable[FleetMember]) -> None:
        """Apply one read of the fleet registry (workers only).

        Members the answer no longer lists leave, unless static (those fall back to their
        command-line role and count as healthy). Load counters of members that stay are
        kept.
        """
        seen: set[str] = set()
        for member in members:
            if member.kind is not FleetKind.WORKER:
                continue
            try:
                url = _normal_url(member.endpoint)
            except ValueError:
                logger.warning("ignoring fleet member with no usable endpoint: %r", member)
                continue
            role = member.role
            seen.add(url)
            live = self._live.get(url)
            if live is not None and live.static_role is not None:
                healthy = member.state not in _STOPPED
            else:
                healthy = member.state is FleetState.READY and not member.stale
            if live is None:
                state = InstanceState(id=url, url=url, role=role, healthy=healthy)
                self._live[url] = _Live(state, None, in_fleet=True)
            else:
                live.state = replace(live.state, role=role, healthy=healthy)
                live.in_fleet = True
        for url, live in list(self._live.items()):
            if url in seen or not live.in_fleet:
                continue
            if live.static_role is not None:
                live.in_fleet = False
                live.state = replace(live.state, role=live.static_role, healthy=True)
            else:
                del self._live[url]


def _normal_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"instance URL must start with http:// or https://, got {url!r}")
    return url.removesuffix("/v1")
