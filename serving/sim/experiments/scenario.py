"""What an evaluation runs: a trace, a cluster of a fixed size, an SLO, a duration, a seed.

The SLOs are per trace, set a few times above what a lightly loaded cluster achieves
(``docs/experiments/control.md`` gives the unloaded latencies they were chosen from):
Azure conversation prompts are short (p50 1 k tokens), Azure code ones longer (p50 1.5 k),
Mooncake's very long (p50 12 k, up to 135 k tokens), so one TTFT threshold cannot fit all
three. ITL is judged per request on its largest gap (``exporters.slo``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from exporters.slo import Metric, Objective
from serving.sim.cluster import ClusterSpec, SimOptions, parse_cluster
from serving.sim.instance import Instance
from serving.sim.latency_model import LatencyModel
from serving.traces import TRACE_NAMES, Trace, load_trace

__all__ = ["TRACE_SLOS", "Scenario", "cached_trace", "slo_for"]

#: TTFT and ITL thresholds (seconds) per trace.
TRACE_SLOS: dict[str, tuple[float, float]] = {
    "azure_conv": (0.25, 0.05),
    "azure_code": (0.5, 0.05),
    "mooncake": (5.0, 0.05),
}


def slo_for(trace: str) -> tuple[Objective, ...]:
    """The evaluation's objectives for ``trace`` (one of :data:`TRACE_SLOS`)."""
    try:
        ttft_s, itl_s = TRACE_SLOS[trace]
    except KeyError:
        raise ValueError(f"trace: expected one of {sorted(TRACE_SLOS)}, got {trace!r}") from None
    return (Objective(Metric.TTFT, ttft_s), Objective(Metric.ITL, itl_s))


@functools.lru_cache(maxsize=8)
def cached_trace(name: str) -> Trace:
    """A trace by name, read once per process (every run of an evaluation replays it)."""
    if name not in TRACE_NAMES:
        raise ValueError(f"trace: expected one of {list(TRACE_NAMES)}, got {name!r}")
    return load_trace(name)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A trace on ``num_instances`` PD instances (the split varies), judged against
    ``objectives`` at ``target``, with ``duration_s`` virtual seconds of arrivals.

    ``cluster`` holds the other cluster-string keys (model, tp, batching; no pools).
    """

    trace: str
    num_instances: int
    duration_s: float
    objectives: tuple[Objective, ...] = field(default_factory=tuple)
    target: float = 0.95
    cluster: str = "model=llama3.1-8b"
    seed: int = 1

    def __post_init__(self) -> None:
        if self.num_instances < 2:
            raise ValueError(f"num_instances: a PD cluster needs >= 2, got {self.num_instances}")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration_s: must be a finite number > 0, got {self.duration_s!r}")
        if not (0 < self.target < 1):
            raise ValueError(f"target: must be in (0, 1), got {self.target!r}")
        if not self.objectives:
            object.__setattr__(self, "objectives", slo_for(self.trace))

    def spec(self, split: tuple[int, int]) -> ClusterSpec:
        """The cluster with ``split = (prefill, decode)`` instances."""
        prefill, decode = split
        if prefill + decode != self.num_instances:
            raise ValueError(
                f"split: prefill + decode must be {self.num_instances}, got {prefill}+{decode}"
            )
        extra = f",{self.cluster}" if self.cluster else ""
        return parse_cluster(f"prefill={prefill},decode={decode}{extra}")

    def max_context_tokens(self) -> int:
        """The longest request (prompt + output tokens) one instance's KV cache holds."""
        spec = self.spec((1, self.num_instances - 1))
        return Instance(spec.instance, LatencyModel.for_profile(spec.profile)).capacity_tokens

    def options(self, *, sample_interval_s: float | None = None) -> SimOptions:
        """Simulator options: this SLO, this seed, every record kept for per-request
        verdicts."""
        return SimOptions(
            objectives=self.objectives,
            slo_target=self.target,
            seed=self.seed,
            keep_records=True,
            sample_interval_s=sample_interval_s,
        )

    def with_duration(self, duration_s: float) -> Scenario:
        return replace(self, duration_s=duration_s)
