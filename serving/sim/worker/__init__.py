"""The sim worker: an OpenAI-compatible server that behaves like a vLLM instance on an
H100, in real time, under the timing model (docs/sim-worker.md).

* :class:`SimEngine` — one instance of the instance model stepped against the event
  loop's clock; tokens come out on the modelled schedule;
* :func:`create_app` — the HTTP server (completions, chat, models, health, vLLM metrics);
* :class:`KVHandoff` — prefill → decode hand-off (``kv_transfer_params`` or a shared folder);
* :class:`SimWorkerControl` — role and drain for the fleet agent;
* :func:`run_sim_worker` — ``goodput worker --engine sim``.
"""

from serving.sim.worker.cli import SimWorkerError, SimWorkerSpec, build_worker, run_sim_worker
from serving.sim.worker.control import SimWorkerControl
from serving.sim.worker.engine import SimEngine, SimRequest, TooLongError
from serving.sim.worker.handoff import HandoffError, KVHandoff, LegPlan
from serving.sim.worker.server import ServerSettings, create_app

__all__ = [
    "HandoffError",
    "KVHandoff",
    "LegPlan",
    "ServerSettings",
    "SimEngine",
    "SimRequest",
    "SimWorkerControl",
    "SimWorkerError",
    "SimWorkerSpec",
    "TooLongError",
    "build_worker",
    "create_app",
    "run_sim_worker",
]
