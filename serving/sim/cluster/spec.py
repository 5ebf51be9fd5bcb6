"""The simulated cluster: pools, GPU type, model, parallelism, batching, placement.

:func:`parse_cluster` reads the ``goodput sim --cluster`` string, comma-separated
``key=value`` pairs::

    prefill=16,decode=48,gpu=h100,model=llama3.1-70b,tp=4

Keys (defaults in brackets): ``prefill`` and ``decode`` (instances of each pool; with
``--colocated N`` neither, and ``N`` instances serve both phases), ``gpu`` [h100],
``model`` [llama3.1-8b] (``llama3.1-70b``, ``llama-3.1-70b`` or ``llama2-70b`` spellings),
``tp`` [1] (GPUs per instance), ``strategy`` [chunked] (static, dynamic, continuous,
chunked), ``max_seqs`` [256], ``max_batched_tokens`` [8192], ``batch_size`` [8] and
``batch_window`` [0.05 s] (static/dynamic), ``kv_tokens`` [from the model and GPU memory],
``memory_utilization`` [0.9], ``prefix_cache`` [on], ``jitter`` [0.02], ``link`` [auto:
NVLink inside a node, 400 Gb/s RDMA between nodes; or ``nvlink`` / ``rdma-400g``],
``gpus_per_node`` [8].

Instances are placed in order on nodes of ``gpus_per_node`` GPUs: prefill instances
first, then decode ones, each on ``tp`` consecutive GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from serving.sim.coefficients import profile_name
from serving.sim.instance import InstanceConfig, Strategy
from serving.sim.latency_model import profile_names
from serving.sim.models import MODELS

__all__ = ["LINKS", "ClusterSpec", "ClusterSpecError", "parse_cluster"]

LINKS = ("auto", "nvlink", "rdma-400g")
_INT_KEYS = ("prefill", "decode", "tp", "max_seqs", "max_batched_tokens", "batch_size")
_KEYS = (
    *_INT_KEYS,
    "gpu",
    "model",
    "strategy",
    "batch_window",
    "kv_tokens",
    "memory_utilization",
    "prefix_cache",
    "jitter",
    "link",
    "gpus_per_node",
)


class ClusterSpecError(ValueError):
    """A cluster string that cannot be simulated; the message names the key and why."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A cluster to simulate (see the module docstring). ``num_colocated > 0`` means a
    colocated cluster (then ``num_prefill == num_decode == 0``)."""

    num_prefill: int = 0
    num_decode: int = 0
    num_colocated: int = 0
    gpu: str = "h100"
    model: str = "llama-3.1-8b"
    tensor_parallel: int = 1
    instance: InstanceConfig = field(default_factory=InstanceConfig)
    link: str = "auto"
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        counts = (self.num_prefill, self.num_decode, self.num_colocated)
        if min(counts) < 0:
            raise ClusterSpecError(f"instance counts must be >= 0, got {counts}")
        if self.num_colocated and (self.num_prefill or self.num_decode):
            raise ClusterSpecError(
                "prefill/decode: a colocated cluster (--colocated N) has no prefill or decode "
                f"pool, got prefill={self.num_prefill}, decode={self.num_decode}"
            )
        if not self.num_colocated and not (self.num_prefill and self.num_decode):
            raise ClusterSpecError(
                "prefill/decode: a PD cluster needs >= 1 instance in each pool, got "
                f"prefill={self.num_prefill}, decode={self.num_decode} "
                "(or pass --colocated N)"
            )
        if self.profile not in profile_names():
            raise ClusterSpecError(
                f"gpu/model/tp: no fitted profile {self.profile!r}; "
                f"known: {', '.join(profile_names())}"
            )
        if self.link not in LINKS:
            raise ClusterSpecError(f"link must be one of {list(LINKS)}, got {self.link!r}")
        if self.gpus_per_node < 1:
            raise ClusterSpecError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")

    @property
    def colocated(self) -> bool:
        return self.num_colocated > 0

    @property
    def profile(self) -> str:
        return profile_name(self.gpu, self.model, self.tensor_parallel)

    @property
    def num_instances(self) -> int:
        return self.num_prefill + self.num_decode + self.num_colocated

    @property
    def num_gpus(self) -> int:
        return self.num_instances * self.tensor_parallel

    def node_of(self, instance_index: int) -> int:
        """The node holding the first GPU of instance ``instance_index``."""
        return instance_index * self.tensor_parallel // self.gpus_per_node

    def describe(self) -> str:
        pools = (
            f"{self.num_colocated} colocated"
            if self.colocated
            else f"{self.num_prefill} prefill + {self.num_decode} decode"
        )
        return (
            f"{pools} instances of {self.model} tp{self.tensor_parallel} on "
            f"{self.num_gpus} {self.gpu.upper()} GPUs ({self.instance.strategy.value} batching)"
        )


def _model_name(text: str) -> str:
    name = text.strip().lower()
    if name.startswith("llama") and not name.startswith("llama-"):
        name = "llama-" + name[len("llama") :]
    if name not in MODELS:
        known = ", ".join(m.replace("llama-", "llama", 1) for m in sorted(MODELS))
        raise ClusterSpecError(f"model: unknown model {text!r}; known: {known}")
    return name


def _number(key: str, value: str, *, integer: bool, minimum: float) -> float:
    try:
        number = int(value) if integer else float(value)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ClusterSpecError(f"{key}: expected {kind}, got {value!r}") from None
    if not (math.isfinite(number) and number >= minimum):
        raise ClusterSpecError(f"{key}: must be >= {minimum:g}, got {value!r}")
    return number


def parse_cluster(text: str, *, colocated: int = 0) -> ClusterSpec:
    """A :class:`ClusterSpec` from the ``--cluster`` string and ``--colocated N``."""
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or not value.strip():
            raise ClusterSpecError(f"cluster: expected key=value, got {part!r}")
        if key not in _KEYS:
            raise ClusterSpecError(f"cluster: unknown key {key!r}; allowed: {list(_KEYS)}")
        if key in values:
            raise ClusterSpecError(f"cluster: {key} is given twice")
        values[key] = value.strip()
    ints = {
        k: int(_number(k, values[k], integer=True, minimum=0)) for k in _INT_KEYS if k in values
    }
    strategy = values.get("strategy", Strategy.CHUNKED.value).lower()
    if strategy not in {s.value for s in Strategy}:
        raise ClusterSpecError(
            f"strategy must be one of {[s.value for s in Strategy]}, got {values['strategy']!r}"
        )
    prefix = values.get("prefix_cache", "on").lower()
    if prefix not in ("on", "off", "true", "false", "1", "0"):
        raise ClusterSpecError(f"prefix_cache must be on or off, got {values['prefix_cache']!r}")
    kv_tokens = values.get("kv_tokens")
    try:
        instance = InstanceConfig(
            strategy=Strategy(strategy),
            max_num_seqs=ints.get("max_seqs", 256),
            max_num_batched_tokens=ints.get("max_batched_tokens", 8192),
            batch_size=ints.get("batch_size", 8),
            batch_window_s=_number(
                "batch_window", values.get("batch_window", "0.05"), integer=False, minimum=0
            ),
            kv_capacity_tokens=(
                None
                if kv_tokens is None
                else int(_number("kv_tokens", kv_tokens, integer=True, minimum=1))
            ),
            memory_utilization=_number(
                "memory_utilization",
                values.get("memory_utilization", "0.9"),
                integer=False,
                minimum=0,
            ),
            prefix_caching=prefix in ("on", "true", "1"),
            jitter_ratio=_number("jitter", values.get("jitter", "0.02"), integer=False, minimum=0),
        )
    except ValueError as exc:
        raise ClusterSpecError(f"cluster: {exc}") from None
    tp = ints.get("tp", 1)
    if tp < 1:
        raise ClusterSpecError(f"tp: must be >= 1, got {tp}")
    if colocated < 0:
        raise ClusterSpecError(f"colocated: must be >= 0, got {colocated}")
    return ClusterSpec(
        num_prefill=ints.get("prefill", 0),
        num_decode=ints.get("decode", 0),
        num_colocated=colocated,
        gpu=values.get("gpu", "h100").lower(),
        model=_model_name(values.get("model", "llama3.1-8b")),
        tensor_parallel=tp,
        instance=instance,
        link=values.get("link", "auto").lower(),
        gpus_per_node=int(
            _number("gpus_per_node", values.get("gpus_per_node", "8"), integer=True, minimum=1)
        ),
    )
