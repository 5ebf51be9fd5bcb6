"""KV-cache sizes, how many tokens fit on a GPU, and how long a KV cache takes to move.

* Bytes per token = 2 (K and V) × layers × KV heads × head dim × bytes per element. With
  tensor parallelism each GPU holds ``num_kv_heads / tp`` heads (at least one: vLLM
  replicates KV heads when ``tp > num_kv_heads``).
* Transfer time of ``b`` bytes over ``s`` parallel streams = ``setup_s + b / (s ×
  bytes_per_s)``, with ``setup_s`` and ``bytes_per_s`` fitted to Vidur's H100 DGX
  ``send_recv`` profile (the calibration table's ``links``): ``"nvlink"`` between two GPUs of
  one node (NVSwitch), ``"rdma-400g"`` between GPUs of two nodes (one 400 Gb/s NIC each).
  A prefill and a decode instance with tensor parallelism move their KV shards in parallel,
  one stream per rank pair (each H100 of an HGX has its own NVLink ports and its own NIC,
  8 × 400 Gb/s per node), so ``num_streams = min(prefill_tp, decode_tp)``.

Example (the seed article's table: an 8k-token prompt, batch 1)::

    kv_bytes(get_model("llama-3.1-8b"), 8192) / 2**30    # 1.0 GiB
    kv_transfer_s(kv_bytes(get_model("llama-3.1-8b"), 8192), "rdma-400g")  # ≈ 0.03 s
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from serving.sim.calibrated import committed_calibration
from serving.sim.coefficients import LinkFit
from serving.sim.models import ModelShape

__all__ = [
    "H100_MEMORY_BYTES",
    "HGX_H100_NICS",
    "NIC_LINE_RATE_BYTES_PER_S",
    "get_link",
    "kv_bytes",
    "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu",
    "kv_capacity_tokens",
    "kv_transfer_s",
]

F64 = npt.NDArray[np.float64]

H100_MEMORY_BYTES = 81_559 * 2**20
"""Memory of an H100 SXM5 80GB as ``nvidia-smi`` reports it (81559 MiB)."""
HGX_H100_NICS = 8
"""NICs of an HGX H100 node: one 400 Gb/s NIC per GPU."""
NIC_LINE_RATE_BYTES_PER_S = 400e9 / 8
"""Line rate of one NIC; Vidur measured ~72 % of it GPU-to-GPU (``"rdma-400g"``)."""


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def kv_bytes_per_token(shape: ModelShape, bytes_per_element: int = 2) -> int:
    """KV-cache bytes one token adds (all layers, all KV heads, K and V)."""
    _check_positive("bytes_per_element", bytes_per_element)
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * bytes_per_element


def kv_bytes_per_token_per_gpu(
    shape: ModelShape, tensor_parallel: int, bytes_per_element: int = 2
) -> int:
    """The share of :func:`kv_bytes_per_token` one GPU of a ``tensor_parallel`` group holds."""
    _check_positive("tensor_parallel", tensor_parallel)
    heads = shape.num_kv_heads
    if heads % tensor_parallel and tensor_parallel % heads:
        raise ValueError(
            f"tensor_parallel must divide or be a multiple of {shape.name}'s "
            f"{heads} KV heads, got {tensor_parallel}"
        )
    heads_per_gpu = max(heads // tensor_parallel, 1)
    return 2 * shape.num_layers * heads_per_gpu * shape.head_dim * bytes_per_element


def kv_bytes(
    shape: ModelShape, num_tokens: int, batch_size: int = 1, bytes_per_element: int = 2
) -> int:
    """KV-cache bytes of ``batch_size`` sequences of ``num_tokens`` tokens each."""
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    return kv_bytes_per_token(shape, bytes_per_element) * num_tokens * batch_size


def kv_capacity_tokens(
    shape: ModelShape,
    tensor_parallel: int,
    gpu_memory_bytes: int = H100_MEMORY_BYTES,
    memory_utilization: float = 0.9,
    bytes_per_element: int = 2,
) -> int:
    """Tokens of KV cache an instance holds: what ``memory_utilization`` of each GPU leaves
    after its share of the weights, over each GPU's bytes per token (vLLM's
    ``gpu_memory_utilization``; activation workspace is not subtracted, so this is an upper
    bound). 0 when the weights alone do not fit."""
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization}")
    per_gpu = kv_bytes_per_token_per_gpu(shape, tensor_parallel, bytes_per_element)
    weights = shape.weight_bytes(bytes_per_element) / tensor_parallel
    free = gpu_memory_bytes * memory_utilization - weights
    return max(int(free // per_gpu), 0)


def get_link(name: str) -> LinkFit:
    """The fitted link named ``name`` (``"nvlink"`` or ``"rdma-400g"``)."""
    links = committed_calibration().links
    for link in links:
        if link.name == name:
            return link
    known = ", ".join(link.name for link in links)
    raise KeyError(f"unknown link {name!r}; known links: {known}")


def kv_transfer_s(num_bytes: float | F64, link: LinkFit | str, num_streams: int = 1) -> float | F64:
    """Seconds to move ``num_bytes`` (scalar or array) over ``num_streams`` parallel streams
    of ``link``; each stream pays the setup once and carries ``num_bytes / num_streams``."""
    _check_positive("num_streams", num_streams)
    fit = get_link(link) if isinstance(link, str) else link
    size = np.asarray(num_bytes, dtype=np.float64)
    if np.any(size < 0):
        raise ValueError(f"num_bytes must be >= 0, got min {float(np.min(size))}")
    seconds = fit.setup_s + size / (num_streams * fit.bytes_per_s)
    return float(seconds) if seconds.ndim == 0 else seconds
