"""The cluster simulator: hundreds of simulated GPUs replaying a trace in virtual time.

* :func:`parse_cluster` / :class:`ClusterSpec` — pools, GPU, model, parallelism, batching;
* :func:`build_workload` / :class:`Workload` — a trace rate-scaled and repeated;
* :class:`Simulator` / :class:`SimOptions` / :class:`SimResult` — the discrete-event core:
  the live gateway's routing, a policy seam, records into the goodput engine;
* :class:`SimPolicy`, :class:`NoControl`, :func:`load_policy` — the policy seam;
* :func:`build_report`, :func:`format_summary`, :func:`write_plots` — the outputs.

See docs/simulator.md.
"""

from serving.sim.cluster.policy import (
    ClusterSnapshot,
    InstanceView,
    NoControl,
    PolicyError,
    SimPolicy,
    load_policy,
)
from serving.sim.cluster.records import RecordBuilder
from serving.sim.cluster.results import SimOptions, SimProgress, SimResult, TimeSeries
from serving.sim.cluster.router import Router
from serving.sim.cluster.simulator import SLO_ID, Simulator
from serving.sim.cluster.spec import ClusterSpec, ClusterSpecError, parse_cluster
from serving.sim.cluster.workload import Workload, build_workload

__all__ = [
    "SLO_ID",
    "ClusterSnapshot",
    "ClusterSpec",
    "ClusterSpecError",
    "InstanceView",
    "NoControl",
    "PolicyError",
    "RecordBuilder",
    "Router",
    "SimOptions",
    "SimPolicy",
    "SimProgress",
    "SimResult",
    "Simulator",
    "TimeSeries",
    "Workload",
    "build_workload",
    "load_policy",
    "parse_cluster",
]
