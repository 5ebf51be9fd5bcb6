"""What the control plane's latency learner knows about a profiled cluster: the one source of
the control loops' capacities in the simulator.

Live, the control plane learns :class:`~controlplane.policies.learning.LearnedParams` from
ingested records; the simulator's adapters (admission, our planner, the Dynamo-style
planner) start from the same parameters read off the cluster's fitted profile — what
Dynamo calls pre-deployment profiling:

* **prefill rate** — the mean prompt in full batches (``max_num_batched_tokens`` 8,192, the
  instance model's default), as a loaded engine's busy time shows it;
* **decode step** ``itl = base + per_seq·b + per_token·C`` — the profile's decode
  coefficients below the knee;
* **KV handoff** — the mean prompt's KV cache over NVLink;
* **mean decode time and context** — the mean output at the ITL of ``decode_batch``
  streams, the mean prompt plus half the mean output.

The planner reads them through :func:`controlplane.policies.planner.service_model`, as the
live planner does.

Example::

    params = profile_params("h100-llama3.1-8b", prompt_tokens=2048, output_tokens=128)
"""

from __future__ import annotations

import functools

import numpy as np

from controlplane.policies.learning import LearnedParams
from serving.sim.kv import get_link
from serving.sim.latency_model import LatencyModel

__all__ = ["DEFAULT_PROFILE", "latency_model", "profile_params"]

DEFAULT_PROFILE = "h100-llama3.1-8b"
_BATCH_TOKENS = 8192  # the instance model's default max_num_batched_tokens


@functools.cache
def latency_model(profile: str) -> LatencyModel:
    """The fitted profile's step times (read once per process)."""
    return LatencyModel.for_profile(profile)


def profile_params(
    profile: str,
    *,
    prompt_tokens: float = 1024.0,
    output_tokens: float = 256.0,
    decode_batch: float = 1.0,
) -> LearnedParams:
    """The latency model of ``profile`` at these mean lengths and this decode batch per
    instance (see the module docstring)."""
    latency = latency_model(profile)
    prompt = max(1, round(prompt_tokens))
    per_batch = max(1, _BATCH_TOKENS // prompt)
    rate = per_batch * prompt / latency.prefill_s(np.full(per_batch, prompt))
    decode = latency.profile.decode
    link = get_link("nvlink")
    handoff = link.setup_s + prompt * latency.kv_bytes_per_token_per_gpu / link.bytes_per_s
    context = prompt + output_tokens / 2
    batch = max(1.0, decode_batch)
    itl = decode.base_s + decode.per_unit_s * batch + decode.per_attention_unit_s * batch * context
    return LearnedParams(
        prefill_tokens_per_s=rate,
        kv_handoff_s=handoff,
        itl_base_s=decode.base_s,
        itl_per_stream_s=decode.per_unit_s,
        itl_per_context_token_s=decode.per_attention_unit_s,
        mean_decode_s=max(output_tokens * itl, 1e-3),
        mean_context_tokens=context,
    )
