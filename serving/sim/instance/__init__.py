"""One engine instance in virtual time: the four batching strategies of the seed article,
KV blocks with recompute preemption, an LRU prefix cache, colocated or PD-disaggregated
roles (docs/simulator.md).

* :class:`InstanceConfig` / :class:`Strategy` — how it batches and its limits;
* :class:`Job` / :class:`JobMode` — a request on an instance (``FULL`` colocated,
  ``PREFILL`` / ``DECODE`` halves of PD), with its token and phase times;
* :class:`Instance` — the scheduler and its iteration times from the fitted latency model;
* :func:`serve` — a one-instance event loop.

Example::

    inst = Instance(InstanceConfig(strategy="continuous"),
                    LatencyModel.for_profile("h100-llama3.1-8b"))
    done = serve(inst, [Job(0, 0.0, 1000, 50)])
    done[0].emission_times()   # 50 token times, seconds
"""

from serving.sim.instance.config import InstanceConfig, Strategy
from serving.sim.instance.instance import Instance, InstanceStats
from serving.sim.instance.job import Job, JobMode
from serving.sim.instance.runner import serve

__all__ = ["Instance", "InstanceConfig", "InstanceStats", "Job", "JobMode", "Strategy", "serve"]
