"""The policy seam: where admission control and PD planning plug into the simulator.

docs/architecture.md: policies are pure functions of observed state and an injected clock, so the
simulator runs the same code the control plane runs live. A :class:`SimPolicy` has two
decisions:

* ``admit(info) -> Decision`` per request, with the gateway's admission types
  (:mod:`serving.gateway.admission`; ``info.arrival_s`` is virtual time) — a rejected
  request is recorded ``REJECTED``, which counts against availability;
* ``plan(snapshot) -> {instance id: role}`` every ``interval_s`` virtual seconds: the
  instances to move between the prefill and decode pools (an instance keeps serving what
  it holds; only new routing follows its new role). ``{}`` changes nothing.

:class:`NoControl` admits everything and never moves an instance (``--policy none``).
``--policy module:attribute`` loads another: the attribute is a policy object, or a
class or factory called with no arguments that returns one (the control-loop policies of
``controlplane.policies`` plug in this way, through a thin adapter where their types
differ).

Example::

    class ShedWhenQueued:
        interval_s = 1.0
        def __init__(self) -> None:
            self.queued = 0
        def admit(self, info: RequestInfo) -> Decision:
            return ADMIT if self.queued < 1000 else Decision(False, "queue full")
        def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
            self.queued = sum(i.waiting for i in snapshot.instances)
            return {}
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from controlplane.goodput.stats import GoodputStats
from exporters.fleet import PoolRole
from serving.gateway.admission import ADMIT, Decision, RequestInfo

__all__ = [
    "ClusterSnapshot",
    "InstanceView",
    "NoControl",
    "PolicyError",
    "SimPolicy",
    "load_policy",
]


class PolicyError(ValueError):
    """A policy that cannot be loaded or returned an invalid plan; the message says why."""


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One instance as a policy sees it: its pool, queue, batch and KV use, and the load
    the gateway counts on it."""

    id: str
    role: PoolRole
    waiting: int
    running: int
    kv_used_ratio: float
    prefill_tokens: int
    decode_streams: int


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """What a policy observes at ``now_s`` (virtual seconds since the start): every
    instance, and each SLO's goodput stats over the last minute from the goodput engine."""

    now_s: float
    instances: tuple[InstanceView, ...]
    goodput: Sequence[GoodputStats] = field(default_factory=tuple)


@runtime_checkable
class SimPolicy(Protocol):
    """Admission and PD planning (see the module docstring)."""

    interval_s: float

    def admit(self, info: RequestInfo) -> Decision: ...

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]: ...


class NoControl:
    """No control: admit every request, never move an instance."""

    interval_s = math.inf

    def admit(self, info: RequestInfo) -> Decision:
        del info
        return ADMIT

    def plan(self, snapshot: ClusterSnapshot) -> Mapping[str, PoolRole]:
        del snapshot
        return {}


def load_policy(name: str) -> SimPolicy:
    """``"none"`` → :class:`NoControl`; ``"package.module:attribute"`` → that policy (or
    what calling it with no arguments returns)."""
    if name.strip().lower() == "none":
        return NoControl()
    module_name, sep, attribute = name.partition(":")
    if not sep or not module_name or not attribute:
        raise PolicyError(f"policy: expected 'none' or 'package.module:attribute', got {name!r}")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise PolicyError(f"policy: cannot load {name!r} ({exc})") from None
    if isinstance(target, SimPolicy) and not isinstance(target, type):
        policy = target
    else:
        try:
            policy = target()
        except TypeError as exc:
            raise PolicyError(f"policy: cannot create {name!r} with no arguments ({exc})") from None
    if not isinstance(policy, SimPolicy):
        raise PolicyError(
            f"policy: {name!r} is not a SimPolicy (needs interval_s, admit(info) and "
            f"plan(snapshot)); got {type(policy).__name__}"
        )
    interval = policy.interval_s
    if not (isinstance(interval, int | float) and interval > 0):
        raise PolicyError(f"policy: interval_s must be a number > 0, got {interval!r}")
    return policy
