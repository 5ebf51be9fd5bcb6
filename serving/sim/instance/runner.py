"""Serve a list of jobs on one instance: the smallest event loop around an Instance.

The cluster simulator runs many instances under one heap; this loop is for one, in tests,
examples and calibration. Arrivals at the same time as an instance event are handled
first, so a job arriving exactly at an iteration boundary joins at that boundary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from serving.sim.instance.instance import Instance
from serving.sim.instance.job import Job

__all__ = ["serve"]


def serve(
    instance: Instance, jobs: Sequence[Job], *, close: bool = True, until_s: float = math.inf
) -> list[Job]:
    """Submit each job at its ``arrival_s`` and step the instance until it is idle (or
    ``until_s``); returns the completed jobs in completion order. ``close`` tells the
    instance after the last arrival that no more will come (static and dynamic batching
    then start a partial batch; without it they wait for a full one)."""
    order = sorted(jobs, key=lambda j: j.arrival_s)
    done: list[Job] = []
    i, n = 0, len(order)
    if close and not n:
        instance.close(0.0)
    while True:
        next_s = instance.next_event_s
        if i < n and order[i].arrival_s <= next_s:
            job = order[i]
            if job.arrival_s > until_s:
                break
            instance.submit(job, job.arrival_s)
            i += 1
            if i == n and close:
                instance.close(job.arrival_s)
        elif next_s < math.inf and next_s <= until_s:
            done.extend(instance.step(next_s))
        else:
            break
    return done
