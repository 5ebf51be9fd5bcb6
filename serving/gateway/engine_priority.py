"""Engine priorities: a request's class sent to vLLM as its ``priority``, so that the engine's
queues serve the higher classes first.

vLLM started with ``--scheduling-policy priority`` keeps its waiting requests in a heap
ordered by the request body's ``priority`` (an integer, lower first; 0 when absent), then
by arrival; a request already being prefilled keeps its place. Under the default ``fcfs``
policy vLLM 0.32 ignores the field. The gateway knows each request's class
(``x-goodput-priority``) and, with ``--engine-priority``, writes the class's number into
the body of both legs (prefill and decode; the one leg in colocated mode):

* ``off`` (the default): the body is relayed as the client sent it;
* ``policy``: from the class order of the admission policy in force
  (:func:`class_ranks`): the never-shed classes first (0), then the sheddable ones from
  the highest ``shed_order`` down, one number per distinct (``sheddable``, ``shed_order``),
  so with the control plane's default classes ``critical`` 0, ``standard`` 1,
  ``sheddable`` 2. A class the policy does not list (or a request without the header) gets
  the number of a class with the admission rule's defaults (sheddable, ``shed_order`` 0):
  the rule judges it as one. Before the first policy nothing is written;
* an explicit map, ``critical=0,standard=1,sheddable=2`` (``*=N`` for every other class;
  without it other classes are sent with none, which vLLM reads as 0).

Unless it is ``off``, the gateway decides every request's number: a ``priority`` the client
sent is replaced, or removed where the class has no number (the class, which the operator
controls, decides the order, not the client). :meth:`EnginePriority.of` is
O(1) per request (the ranks of a policy are computed once per policy applied).

The admission rule reads the same number (``RequestInfo.engine_priority``) to predict the
TTFT under this order: docs/admission.md, "Engine priorities".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporters.admission import AdmissionPolicy, ClassPolicy

__all__ = ["POLICY", "EnginePriority", "class_ranks", "with_priority"]

POLICY = "policy"
OFF = "off"
_ENTRY = re.compile(r"\s*([^=\s,]+)\s*=\s*(-?\d+)\s*")
_LIMIT = 2**31 - 1  # vLLM's field is an int; keep it in a 32-bit range


def _key(rules: ClassPolicy) -> tuple[bool, int]:
    """Sort key of a class: never-shed first, then the highest ``shed_order`` first."""
    return (rules.sheddable, -rules.shed_order)


def class_ranks(classes: Mapping[str, ClassPolicy]) -> tuple[dict[str, int], int]:
    """The engine priority of every class of a policy, and that of a class it does not
    list (judged by the admission rule as ``ClassPolicy()``): rank = the number of distinct
    class keys that come before the class's own (never-shed first, then by descending
    ``shed_order``), so equal classes share a number and the numbers have no gaps."""
    keys = sorted({_key(rules) for rules in classes.values()})
    rank = {key: i for i, key in enumerate(keys)}
    default_key = _key(ClassPolicy())
    default = rank.get(default_key, sum(key < default_key for key in keys))
    return {name: rank[_key(rules)] for name, rules in classes.items()}, default


@dataclass(slots=True)
class EnginePriority:
    """How the gateway maps a request's class to the engine's ``priority`` (see the module
    docstring). Build it with :meth:`parse`; :meth:`of` answers per request."""

    mode: str = OFF  # "off", "policy" or "map"
    mapping: dict[str, int] = field(default_factory=dict)
    default: int | None = None  # the "*" entry of a map
    _policy: AdmissionPolicy | None = None  # the policy whose ranks are cached
    _ranks: tuple[dict[str, int], int] = ({}, 0)

    @classmethod
    def parse(cls, text: str) -> EnginePriority:
        """``off``, ``policy`` or ``NAME=N[,NAME=N…][,*=N]``; ``ValueError`` naming the
        part that is wrong."""
        spec = text.strip()
        if spec in ("", OFF):
            return cls()
        if spec == POLICY:
            return cls(POLICY)
        mapping: dict[str, int] = {}
        default = None
        for part in spec.split(","):
            match = _ENTRY.fullmatch(part)
            if match is None:
                raise ValueError(
                    f"engine_priority must be 'off', 'policy' or CLASS=N pairs separated by "
                    f"commas (e.g. critical=0,standard=1,sheddable=2,*=3), got {text!r} "
                    f"(the part {part!r})"
                )
            name, number = match.group(1), int(match.group(2))
            if not -_LIMIT <= number <= _LIMIT:
                raise ValueError(f"engine_priority: {name}={number} is out of range")
            if name in mapping or (name == "*" and default is not None):
                raise ValueError(f"engine_priority: class {name!r} is given twice in {text!r}")
            if name == "*":
                default = number
            else:
                mapping[name] = number
        return cls("map", mapping, default)

    @property
    def enabled(self) -> bool:
        return self.mode != OFF

    def describe(self) -> str:
        """The setting as ``parse`` reads it (for ``/health``)."""
        if self.mode != "map":
            return self.mode
        parts = [f"{k}={v}" for k, v in self.mapping.items()]
        if self.default is not None:
            parts.append(f"*={self.default}")
        return ",".join(parts)

    def of(self, priority: str, policy: AdmissionPolicy | None) -> int | None:
        """The engine priority of a request of class ``priority`` (``None``: write none)
        under ``policy`` (the admission policy in force; read only in ``policy`` mode)."""
        if self.mode == "map":
            return self.mapping.get(priority, self.default)
        if self.mode != POLICY or policy is None:
            return None
        if policy is not self._policy:
            self._policy, self._ranks = policy, class_ranks(policy.classes)
        ranks, default = self._ranks
        return ranks.get(priority, default)


def with_priority(body: dict[str, Any], priority: int | None) -> dict[str, Any]:
    """A copy of ``body`` with ``"priority": priority``, or without any ``priority`` for
    ``None`` (where the gateway sets engine priorities, a client never sets its own)."""
    out = {k: v for k, v in body.items() if k != "priority"}
    if priority is not None:
        out["priority"] = priority
    return out
