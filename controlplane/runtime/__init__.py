"""What runs for the life of the app, started by its lifespan (:mod:`controlplane.main`).

* :mod:`~controlplane.runtime.live`: the live goodput engine, fed by ingest and persisted;
* :mod:`~controlplane.runtime.summary`: the overview's rows, computed once for every reader;
* :mod:`~controlplane.runtime.loop`: the control loops' base and lifespan, on which run
  :mod:`~controlplane.runtime.admission` (admission policies for the gateways) and
  :mod:`~controlplane.runtime.planner` (the PD planner tick; its snapshot from the database
  rows in :mod:`~controlplane.runtime.planner_snapshot`);
* :mod:`~controlplane.runtime.learner`: the one latency learner the loops share;
* :mod:`~controlplane.runtime.loop_metrics`: what the loops export on ``/metrics``;
* :mod:`~controlplane.runtime.leadership`: which replica runs the loops (a fenced lease).

The pure decisions they call live in :mod:`controlplane.policies`.
"""
