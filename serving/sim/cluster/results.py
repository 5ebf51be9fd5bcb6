"""What a simulation is given and what it gives back: options, progress, samples, results."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from controlplane.goodput.stats import GoodputStats
from exporters.fleet import PoolRole
from exporters.records import RecordBatch
from exporters.slo import Metric, Objective
from serving.sim.cluster.spec import ClusterSpec

__all__ = ["SimOptions", "SimProgress", "SimResult", "TimeSeries"]

F64 = npt.NDArray[np.float64]
_POOLS = (PoolRole.PREFILL, PoolRole.DECODE, PoolRole.BOTH)


@dataclass(frozen=True, slots=True)
class SimOptions:
    """How to run and judge a simulation.

    ``objectives``/``slo_target``: the SLO the goodput engine judges. ``sample_interval_s``
    ``None`` takes 1/500 of the workload's span. ``flush_interval_s``: how often finished
    records go to the engine (virtual seconds). ``exact_routing`` shows ``choose`` the
    whole fleet per request (slow; for checks). ``keep_records`` keeps every batch in the
    result. ``epoch_s``: the wall-clock time virtual 0 maps to (minute-aligned).
    """

    objectives: tuple[Objective, ...] = (Objective(Metric.TTFT, 0.2), Objective(Metric.ITL, 0.05))
    slo_target: float = 0.99
    seed: int = 0
    sample_interval_s: float | None = None
    flush_interval_s: float = 10.0
    exact_routing: bool = False
    keep_records: bool = False
    itl_sample_every: int = 16
    epoch_s: float = 1_700_000_040.0
    request_id_prefix: str = "sim-"


@dataclass(frozen=True, slots=True)
class SimProgress:
    """Where a running simulation is: virtual time, requests arrived and finished."""

    now_s: float
    arrived: int
    finished: int
    total: int


@dataclass(slots=True)
class TimeSeries:
    """Samples over virtual time: instances per pool, and queued / running requests per
    pool (summed over its instances), keyed by ``"prefill"``, ``"decode"``, ``"both"``."""

    time_s: list[float] = field(default_factory=list)
    pool_size: dict[str, list[int]] = field(default_factory=lambda: {p.value: [] for p in _POOLS})
    waiting: dict[str, list[int]] = field(default_factory=lambda: {p.value: [] for p in _POOLS})
    running: dict[str, list[int]] = field(default_factory=lambda: {p.value: [] for p in _POOLS})


@dataclass(slots=True)
class SimResult:
    """What a simulation produced. ``stats`` is the goodput engine's answer for the SLO
    over the whole run (``end_s`` virtual seconds); counts are over all requests."""

    spec: ClusterSpec
    options: SimOptions
    workload_name: str
    stats: GoodputStats
    num_requests: int
    num_finished: int
    num_rejected: int
    num_errors: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    num_preemptions: int
    num_iterations: int
    num_runs: int
    num_events: int
    busy_ratio: float
    end_s: float
    wall_s: float
    series: TimeSeries
    ttft_s: F64
    itl_sample_s: F64
    records: list[RecordBatch] | None = None
