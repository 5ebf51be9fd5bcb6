"""The admission policy: what the control plane tells a gateway, per request, about shedding.

Data, not code: the control plane computes it (``controlplane.policies.admission``) from
what it learned online and the SLO registry, and pushes it in a ``set_admission_policy``
command (:mod:`exporters.commands`); the gateway's rule
(``serving.gateway.admission_policy``) applies it to every request. It carries:

* ``classes``: priority classes (header ``x-goodput-priority``) with their shed order. A
  class with ``sheddable=False`` (e.g. ``critical``) is never shed; the others are shed
  lowest ``shed_order`` first, because each may use only ``headroom_ratio`` of the allowed
  latency: as load grows, the class with the smallest headroom is refused first and the
  room it leaves keeps the higher classes within their SLO;
* ``slos``: per SLO (header ``x-goodput-slo``) the allowed TTFT and ITL, the SLO's burn rate
  and the ``margin_ratio`` that tightens the allowed latency while the burn rate is high
  (shed earlier while the error budget burns);
  and ``infeasible``: what to do with a request predicted to miss the TTFT objective even
  on an idle instance (``"admit"``: best effort, counted apart; ``"reject"``: refused at
  once, without ``Retry-After``);
* ``model``: the learned latency model — prefill rate (per instance where known), KV
  handoff, the decode ITL model ``itl = itl_base_s + itl_per_stream_s·batch +
  itl_per_context_token_s·context_tokens`` (``context_tokens``: the KV tokens of the whole
  batch), the largest decode batch that meets the ITL target, and the mean decode time
  and context of a stream (to predict which running streams are still running later);
* ``tenant_weights``: fair shares (a tenant's share of the in-flight requests is
  ``weight / Σ weights of the tenants with requests in flight``; unlisted tenants weigh 1);
  a tenant above its share has its allowed latency multiplied by ``over_share_ratio``, so it
  is shed first;
* ``prompt_class_bounds`` and ``availability_floor``: the guard against starving one
  prompt-length class. The bounds (ascending prompt-token counts) cut requests into
  ``len(bounds) + 1`` classes (class ``i``: ``bounds[i-1] < p <= bounds[i]``); a request the
  prediction would refuse is admitted anyway while its class's availability (admitted ÷
  offered, over the last minute) is below ``availability_floor`` × the availability of all
  classes together (``0``, or no bounds: no guard);
* ``ttl_s`` and ``fallback_max_concurrency``: how long the gateway trusts the policy
  without a newer one, and the plain concurrency cap it falls back to after that (the
  fleet's cap: each gateway takes its ``share_ratio`` of it);
* ``share_ratio`` (0, 1]: this gateway's share of the fleet's capacity when several
  gateways stand in front of the same instances (the control plane splits 1 between the
  live gateways, in proportion to their offered request rates). The gateway sees only its
  own requests in flight, so it reads the fleet's load as its own ÷ ``share_ratio``, and
  its fallback cap is ``fallback_max_concurrency × share_ratio``: together the gateways
  admit what one would. ``1`` (the default, and every policy written before the field):
  one gateway.

Compatibility with the first version of this contract (``version``, ``ttl_s``,
``fallback_max_concurrency``, ``classes`` of ``shed_order``, ``sheddable``, ``ttft_s``): the
newer fields are optional on input (defaults apply), and ``to_json`` writes them only when
they differ from their defaults, so a policy that uses none of them reads as before.

Example::

    policy = AdmissionPolicy(
        version=7, ttl_s=30.0, fallback_max_concurrency=64,
        classes={"critical": ClassPolicy(sheddable=False),
                 "sheddable": ClassPolicy(shed_order=0, headroom_ratio=0.7)},
        slos={"chat": SLOAdmission(ttft_s=0.5, itl_s=0.05, burn_rate=3.0, margin_ratio=0.8)},
        model=AdmissionModel(prefill_tokens_per_s=20_000.0, kv_handoff_s=0.01),
    )
    assert AdmissionPolicy.from_json(policy.to_json()) == policy
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from exporters._wire_fields import (
    CommandError,
    check_bool,
    check_int,
    check_name,
    check_optional_seconds,
    check_seconds,
)

__all__ = [
    "INFEASIBLE_ACTIONS",
    "AdmissionModel",
    "AdmissionPolicy",
    "ClassPolicy",
    "SLOAdmission",
    "prompt_class",
]

_MAX_INT32 = 2**31 - 1
#: At most this many prompt-class bounds (so at most 17 classes).
MAX_PROMPT_CLASS_BOUNDS = 16
#: What an SLO does with a request it can never serve within its TTFT objective.
INFEASIBLE_ACTIONS = ("admit", "reject")


def prompt_class(bounds: tuple[int, ...], prompt_tokens: int) -> int:
    """The prompt-length class of a ``prompt_tokens`` prompt: the number of ``bounds``
    (ascending) it exceeds, so class ``i`` holds ``bounds[i-1] < p <= bounds[i]``."""
    return bisect.bisect_left(bounds, prompt_tokens)


def _check_bounds(value: Any, path: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_PROMPT_CLASS_BOUNDS:
        raise CommandError(
            path, f"expected at most {MAX_PROMPT_CLASS_BOUNDS} integers, got {value!r}"
        )
    out = tuple(check_int(v, f"{path}[{i}]", 1, _MAX_INT32) for i, v in enumerate(value))
    if any(b <= a for a, b in itertools.pairwise(out)):
        raise CommandError(path, f"must be strictly ascending, got {list(out)!r}")
    return out


def _floor(value: Any, path: str) -> float:
    """An availability floor in [0, 1)."""
    ok = type(value) in (int, float) and math.isfinite(value) and 0.0 <= value < 1.0
    if not ok:
        raise CommandError(path, f"must be a number in [0.0, 1.0), got {value!r}")
    return float(value)


def _check_fields(
    obj: Any, path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``obj`` as a JSON object with every ``required`` key, and no key outside
    ``required + optional`` (an unknown field is an error, never silently ignored)."""
    if not isinstance(obj, dict):
        raise CommandError(path, f"expected an object, got {type(obj).__name__}")
    for key in required:
        if key not in obj:
            raise CommandError(f"{path}.{key}", "missing")
    allowed = (*required, *optional)
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise CommandError(path, f"unknown fields {unknown!r}; allowed: {list(allowed)}")
    return obj


def _check_number(value: Any, path: str, low: float, high: float, *, low_open: bool) -> float:
    ok = type(value) in (int, float) and math.isfinite(value)
    ok = ok and (low < value if low_open else low <= value) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise CommandError(path, f"must be a number in {bracket}{low}, {high}], got {value!r}")
    return float(value)


def _ratio(value: Any, path: str) -> float:
    """A ratio in (0, 1]."""
    return _check_number(value, path, 0.0, 1.0, low_open=True)


def _nonneg(value: Any, path: str) -> float:
    return _check_number(value, path, 0.0, math.inf, low_open=False)


def _positive(value: Any, path: str) -> float:
    return _check_number(value, path, 0.0, math.inf, low_open=True)


def _names(mapping: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(mapping, Mapping):
        raise CommandError(path, f"expected a mapping, got {mapping!r}")
    for name in mapping:
        check_name(name, path)
    return mapping


@dataclass(frozen=True, slots=True)
class ClassPolicy:
    """Admission rules for one priority class (``x-goodput-priority``).

    Under overload the gateway sheds sheddable classes in ascending ``shed_order`` (0 first);
    a class with ``sheddable=False`` is never shed by policy. ``ttft_s`` is the TTFT the class
    is promised where its SLO names none (``None``: no TTFT promise). ``headroom_ratio``
    (0, 1]: the share of the allowed latency the class may use; lower classes get less, so
    they are refused first as the predicted latency grows.
    """

    shed_order: int = 0
    sheddable: bool = True
    ttft_s: float | None = None
    headroom_ratio: float = 1.0

    def __post_init__(self) -> None:
        check_int(self.shed_order, "class.shed_order", 0, 1_000_000)
        check_bool(self.sheddable, "class.sheddable")
        object.__setattr__(self, "ttft_s", check_optional_seconds(self.ttft_s, "class.ttft_s"))
        object.__setattr__(
            self, "headroom_ratio", _ratio(self.headroom_ratio, "class.headroom_ratio")
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "shed_order": self.shed_order,
            "sheddable": self.sheddable,
            "ttft_s": self.ttft_s,
        }
        if self.headroom_ratio != 1.0:
            out["headroom_ratio"] = self.headroom_ratio
        return out

    @classmethod
    def from_json(cls, obj: Any, path: str = "class") -> ClassPolicy:
        obj = _check_fields(obj, path, ("shed_order", "sheddable", "ttft_s"), ("headroom_ratio",))
        check_int(obj["shed_order"], f"{path}.shed_order", 0, 1_000_000)
        check_bool(obj["sheddable"], f"{path}.sheddable")
        return cls(
            obj["shed_order"],
            obj["sheddable"],
            check_optional_seconds(obj["ttft_s"], f"{path}.ttft_s"),
            _ratio(obj.get("headroom_ratio", 1.0), f"{path}.headroom_ratio"),
        )


@dataclass(frozen=True, slots=True)
class SLOAdmission:
    """What admission protects for one SLO: allowed TTFT and ITL (``None``: no such
    objective), the SLO's burn rate when the policy was made, ``margin_ratio`` (0, 1]:
    the factor on the allowed latencies (1 while the budget is safe, smaller while it burns),
    and ``infeasible`` (one of :data:`INFEASIBLE_ACTIONS`): what the gateway does with a
    request whose TTFT on an idle instance (its own prefill and the KV hand-off, no queue)
    is predicted above ``ttft_s`` — ``"admit"`` it as best effort, counted apart, or
    ``"reject"`` it at once. ``to_json`` writes ``infeasible`` only when it is ``"reject"``.
    """

    ttft_s: float | None = None
    itl_s: float | None = None
    burn_rate: float = 0.0
    margin_ratio: float = 1.0
    infeasible: str = "admit"

    def __post_init__(self) -> None:
        self._check("slo")

    def _check(self, path: str) -> None:
        object.__setattr__(self, "ttft_s", check_optional_seconds(self.ttft_s, f"{path}.ttft_s"))
        object.__setattr__(self, "itl_s", check_optional_seconds(self.itl_s, f"{path}.itl_s"))
        object.__setattr__(self, "burn_rate", _nonneg(self.burn_rate, f"{path}.burn_rate"))
        object.__setattr__(self, "margin_ratio", _ratio(self.margin_ratio, f"{path}.margin_ratio"))
        if self.infeasible not in INFEASIBLE_ACTIONS:
            raise CommandError(
                f"{path}.infeasible",
                f"must be one of {list(INFEASIBLE_ACTIONS)}, got {self.infeasible!r}",
            )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ttft_s": self.ttft_s,
            "itl_s": self.itl_s,
            "burn_rate": self.burn_rate,
            "margin_ratio": self.margin_ratio,
        }
        if self.infeasible != "admit":
            out["infeasible"] = self.infeasible
        return out

    @classmethod
    def from_json(cls, obj: Any, path: str = "slo") -> SLOAdmission:
        obj = _check_fields(
            obj, path, ("ttft_s", "itl_s", "burn_rate", "margin_ratio"), ("infeasible",)
        )
        out = cls.__new__(cls)
        for key in ("ttft_s", "itl_s", "burn_rate", "margin_ratio"):
            object.__setattr__(out, key, obj[key])
        object.__setattr__(out, "infeasible", obj.get("infeasible", "admit"))
        out._check(path)
        return out


_MODEL_FIELDS = (
    "prefill_tokens_per_s",
    "instance_prefill_tokens_per_s",
    "kv_handoff_s",
    "itl_base_s",
    "itl_per_stream_s",
    "itl_per_context_token_s",
    "max_decode_batch",
    "mean_decode_s",
    "mean_context_tokens",
)


@dataclass(frozen=True, slots=True)
class AdmissionModel:
    """The learned latency model the gateway predicts with (see the module docstring).

    ``prefill_tokens_per_s``: one prefill instance's rate (per-instance rates in
    ``instance_prefill_tokens_per_s`` override it, keyed by the instance's id as the gateway
    names it: its URL). ``kv_handoff_s``: prefill end to the decode's first token.
    ``max_decode_batch``: the largest batch per decode instance that meets the ITL target.
    ``mean_decode_s``: a stream's mean decode time; ``mean_context_tokens``: a running
    stream's mean KV tokens.
    """

    prefill_tokens_per_s: float
    instance_prefill_tokens_per_s: Mapping[str, float] = field(default_factory=dict)
    kv_handoff_s: float = 0.0
    itl_base_s: float = 0.01
    itl_per_stream_s: float = 0.0
    itl_per_context_token_s: float = 0.0
    max_decode_batch: int = 256
    mean_decode_s: float = 5.0
    mean_context_tokens: float = 1024.0

    def __post_init__(self) -> None:
        self._check("model")

    def _check(self, path: str) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        rate = _positive(self.prefill_tokens_per_s, f"{path}.prefill_tokens_per_s")
        put("prefill_tokens_per_s", rate)
        rates = _names(self.instance_prefill_tokens_per_s, f"{path}.instance_prefill_tokens_per_s")
        put(
            "instance_prefill_tokens_per_s",
            MappingProxyType(
                {
                    k: _positive(v, f"{path}.instance_prefill_tokens_per_s.{k}")
                    for k, v in rates.items()
                }
            ),
        )
        put("kv_handoff_s", _nonneg(self.kv_handoff_s, f"{path}.kv_handoff_s"))
        put("itl_base_s", _nonneg(self.itl_base_s, f"{path}.itl_base_s"))
        put("itl_per_stream_s", _nonneg(self.itl_per_stream_s, f"{path}.itl_per_stream_s"))
        put(
            "itl_per_context_token_s",
            _nonneg(self.itl_per_context_token_s, f"{path}.itl_per_context_token_s"),
        )
        check_int(self.max_decode_batch, f"{path}.max_decode_batch", 1, _MAX_INT32)
        put("mean_decode_s", check_seconds(self.mean_decode_s, f"{path}.mean_decode_s"))
        put("mean_context_tokens", _nonneg(self.mean_context_tokens, f"{path}.mean_context_tokens"))

    def fastest_prefill_rate(self) -> float:
        """The highest prompt tokens/s of any prefill instance (the pool's rate without
        per-instance rates): what an idle instance can do at best."""
        return max((self.prefill_tokens_per_s, *self.instance_prefill_tokens_per_s.values()))

    def prefill_rate(self, instance_id: str | None) -> float:
        """Prompt tokens/s of ``instance_id`` (the pool's rate when it has no own one)."""
        if instance_id is None:
            return self.prefill_tokens_per_s
        return self.instance_prefill_tokens_per_s.get(instance_id, self.prefill_tokens_per_s)

    def itl_s(self, batch: float, context_tokens: float) -> float:
        """Predicted ITL of a decode instance running ``batch`` streams holding
        ``context_tokens`` KV tokens in all."""
        return (
            self.itl_base_s
            + self.itl_per_stream_s * batch
            + self.itl_per_context_token_s * context_tokens
        )

    def to_json(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _MODEL_FIELDS}
        out["instance_prefill_tokens_per_s"] = dict(self.instance_prefill_tokens_per_s)
        return out

    @classmethod
    def from_json(cls, obj: Any, path: str = "model") -> AdmissionModel:
        obj = _check_fields(obj, path, _MODEL_FIELDS)
        if not isinstance(obj["instance_prefill_tokens_per_s"], dict):
            raise CommandError(
                f"{path}.instance_prefill_tokens_per_s",
                f"expected an object, got {obj['instance_prefill_tokens_per_s']!r}",
            )
        out = cls.__new__(cls)
        for name in _MODEL_FIELDS:
            object.__setattr__(out, name, obj[name])
        out._check(path)
        return out


_POLICY_REQUIRED = ("version", "ttl_s", "fallback_max_concurrency", "classes")
_POLICY_OPTIONAL = (
    "share_ratio",
    "slos",
    "model",
    "tenant_weights",
    "over_share_ratio",
    "prompt_class_bounds",
    "availability_floor",
)


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """What the control plane tells a gateway about admission; data, not code.

    The gateway applies it per request for ``ttl_s`` after receiving it; if no newer policy
    arrives by then (the control plane is gone), it falls back to a plain concurrency cap of
    ``fallback_max_concurrency``. ``classes`` maps a priority class name to its
    :class:`ClassPolicy`; a request of an unlisted class gets ``ClassPolicy()``. ``slos``,
    ``model``, ``tenant_weights``, ``over_share_ratio``, ``prompt_class_bounds`` and
    ``availability_floor``: see the module docstring; without
    a ``model`` the gateway predicts nothing and sheds nothing by latency. ``share_ratio``:
    this gateway's share of the fleet's capacity (1: the only gateway; see the module
    docstring); :meth:`fallback_cap` is its part of ``fallback_max_concurrency``.
    ``version`` identifies the policy in metrics and acks.
    """

    version: int
    ttl_s: float
    fallback_max_concurrency: int
    classes: Mapping[str, ClassPolicy] = field(default_factory=dict)
    slos: Mapping[str, SLOAdmission] = field(default_factory=dict)
    model: AdmissionModel | None = None
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    over_share_ratio: float = 0.8
    prompt_class_bounds: tuple[int, ...] = ()
    availability_floor: float = 0.0
    share_ratio: float = 1.0

    def __post_init__(self) -> None:
        check_int(self.version, "policy.version")
        object.__setattr__(self, "share_ratio", _ratio(self.share_ratio, "policy.share_ratio"))
        object.__setattr__(self, "ttl_s", check_seconds(self.ttl_s, "policy.ttl_s"))
        check_int(self.fallback_max_concurrency, "policy.fallback_max_concurrency", 1, _MAX_INT32)
        for name, rules in _names(self.classes, "policy.classes").items():
            if not isinstance(rules, ClassPolicy):
                raise CommandError(
                    f"policy.classes.{name}", f"expected a ClassPolicy, got {rules!r}"
                )
        for name, slo in _names(self.slos, "policy.slos").items():
            if not isinstance(slo, SLOAdmission):
                raise CommandError(f"policy.slos.{name}", f"expected an SLOAdmission, got {slo!r}")
        if self.model is not None and not isinstance(self.model, AdmissionModel):
            raise CommandError("policy.model", f"expected an AdmissionModel, got {self.model!r}")
        weights = {
            k: _positive(v, f"policy.tenant_weights.{k}")
            for k, v in _names(self.tenant_weights, "policy.tenant_weights").items()
        }
        object.__setattr__(
            self, "over_share_ratio", _ratio(self.over_share_ratio, "policy.over_share_ratio")
        )
        object.__setattr__(
            self,
            "prompt_class_bounds",
            _check_bounds(self.prompt_class_bounds, "policy.prompt_class_bounds"),
        )
        object.__setattr__(
            self, "availability_floor", _floor(self.availability_floor, "policy.availability_floor")
        )
        object.__setattr__(self, "classes", MappingProxyType(dict(self.classes)))
        object.__setattr__(self, "slos", MappingProxyType(dict(self.slos)))
        object.__setattr__(self, "tenant_weights", MappingProxyType(weights))

    def fallback_cap(self) -> int:
        """This gateway's fallback concurrency cap: its ``share_ratio`` of the fleet's
        ``fallback_max_concurrency``, rounded, at least 1."""
        return max(1, round(self.fallback_max_concurrency * self.share_ratio))

    def class_policy(self, name: str) -> ClassPolicy:
        """The rules of priority class ``name`` (defaults for a class the policy omits)."""
        return self.classes.get(name) or ClassPolicy()

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "ttl_s": self.ttl_s,
            "fallback_max_concurrency": self.fallback_max_concurrency,
            "classes": {name: rules.to_json() for name, rules in self.classes.items()},
            **({"slos": {k: v.to_json() for k, v in self.slos.items()}} if self.slos else {}),
            **({"model": self.model.to_json()} if self.model is not None else {}),
            **({"tenant_weights": dict(self.tenant_weights)} if self.tenant_weights else {}),
            **({"over_share_ratio": self.over_share_ratio} if self.over_share_ratio != 0.8 else {}),
            **(
                {"prompt_class_bounds": list(self.prompt_class_bounds)}
                if self.prompt_class_bounds
                else {}
            ),
            **({"availability_floor": self.availability_floor} if self.availability_floor else {}),
            **({"share_ratio": self.share_ratio} if self.share_ratio != 1.0 else {}),
        }

    @classmethod
    def from_json(cls, obj: Any, path: str = "policy") -> AdmissionPolicy:
        obj = _check_fields(obj, path, _POLICY_REQUIRED, _POLICY_OPTIONAL)
        check_int(obj["version"], f"{path}.version")
        ttl_s = check_seconds(obj["ttl_s"], f"{path}.ttl_s")
        cap = obj["fallback_max_concurrency"]
        check_int(cap, f"{path}.fallback_max_concurrency", 1, _MAX_INT32)
        for key in ("classes", "slos", "tenant_weights"):
            if not isinstance(obj.get(key, {}), dict):
                raise CommandError(f"{path}.{key}", f"expected an object, got {obj[key]!r}")
        classes = {
            check_name(k, f"{path}.classes"): ClassPolicy.from_json(v, f"{path}.classes.{k}")
            for k, v in obj["classes"].items()
        }
        slos = {
            check_name(k, f"{path}.slos"): SLOAdmission.from_json(v, f"{path}.slos.{k}")
            for k, v in obj.get("slos", {}).items()
        }
        model_obj = obj.get("model")
        model = None if model_obj is None else AdmissionModel.from_json(model_obj, f"{path}.model")
        weights = {
            check_name(k, f"{path}.tenant_weights"): _positive(v, f"{path}.tenant_weights.{k}")
            for k, v in obj.get("tenant_weights", {}).items()
        }
        return cls(
            version=obj["version"],
            ttl_s=ttl_s,
            fallback_max_concurrency=obj["fallback_max_concurrency"],
            classes=classes,
            slos=slos,
            model=model,
            tenant_weights=weights,
            over_share_ratio=_ratio(obj.get("over_share_ratio", 0.8), f"{path}.over_share_ratio"),
            prompt_class_bounds=_check_bounds(
                obj.get("prompt_class_bounds", []), f"{path}.prompt_class_bounds"
            ),
            availability_floor=_floor(
                obj.get("availability_floor", 0.0), f"{path}.availability_floor"
            ),
            share_ratio=_ratio(obj.get("share_ratio", 1.0), f"{path}.share_ratio"),
        )
