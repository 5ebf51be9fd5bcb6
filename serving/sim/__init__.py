"""The timing-model engine's foundation: H100-calibrated step times and KV sizing.

* :class:`LatencyModel` — prefill and decode step times for a fitted profile
  (``LatencyModel.for_profile("h100-llama3.1-8b")``; :func:`profile_names` lists them);
* :mod:`serving.sim.kv` — KV bytes per token, KV capacity, and KV transfer times over NVLink
  and 400 Gb/s RDMA;
* :data:`MODELS` — the model shapes (Llama-3.1-8B/70B/405B, Llama-2-7B/70B).

The coefficients are fitted by ``scripts/fit_latency_model.py``; see ``docs/timing-model.md``.
"""

from serving.sim.coefficients import FitError, LinkFit, ProfileFit, StepCurve
from serving.sim.kv import (
    get_link,
    kv_bytes,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_capacity_tokens,
    kv_transfer_s,
)
from serving.sim.latency_model import LatencyModel, get_profile, profile_names
from serving.sim.models import MODELS, ModelShape, get_model

__all__ = [
    "MODELS",
    "FitError",
    "LatencyModel",
    "LinkFit",
    "ModelShape",
    "ProfileFit",
    "StepCurve",
    "get_link",
    "get_model",
    "get_profile",
    "kv_bytes",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu",
    "kv_capacity_tokens",
    "kv_transfer_s",
    "profile_names",
]
