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
4. **Llama-2-70B** (Splitwise, measured end to end on H100, tp 2/4/8): prefill curves fitted
   to ``prompt_time``, decode curves to ``token_time`` with the step-3 rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from serving.sim.coefficients import (
    AllReduceFit,
    Calibration,
    CrossCheck,
    DecodeAttentionFit,
    LinkFit,
    ProfileFit,
    StepCurve,
)
from serving.sim.fitting import (
    Samples,
    fit_curve,
    fit_error,
    fit_shared_attention,
    held_out,
    significant,
)
from serving.sim.kv import kv_bytes_per_token_per_gpu
from serving.sim.models import ModelShape, get_model
from serving.sim.profiles import (
    LayerProfile,
    SplitwiseProfile,
    read_collective_csv,
    read_layers_csv,
    read_splitwise_csv,
)

__all__ = [
    "LAYER_SOURCES",
    "SPLITWISE_EXCLUDED",
    "LayerSource",
    "build_calibration",
    "profile_name",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

GPU = "h100"
ALL_REDUCE_CSV = "vidur/network/h100_dgx/all_reduce.csv"
SEND_RECV_CSV = "vidur/network/h100_dgx/send_recv.csv"
SPLITWISE_CSV = "splitwise/perf_model_h100_only.csv"
SPLITWISE_MODEL = ("llama2-70b", "h100-80gb", "llama-2-70b")
SPLITWISE_TPS = (2, 4, 8)
ALL_REDUCE_TPS = (2, 4, 8)
LINK_SOURCES = (("nvlink", 2), ("rdma-400g", 1))  # (name, Vidur devices_per_node)

SPLITWISE_EXCLUDED: dict[tuple[int, int], str] = {
    (2, 64): (
        "tp2 batch 64 preempted: prompt_time falls 2.40 s -> 0.36 s from batch 32 and e2e "
        "jumps 9x; 64 x 640 tokens of KV (13.4 GB) beside 69 GB of weights per GPU overflow "
        "an 80 GB H100"
    ),
}
"""Splitwise (tensor parallelism, batch size) configurations left out, with the reason."""

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


def profile_name(gpu: str, model: str, tensor_parallel: int) -> str:
    """``h100-llama3.1-8b``, ``h100-llama3.1-70b-tp4``: tp1 carries no suffix."""
    short = model.replace("llama-", "llama", 1)
    return f"{gpu}-{short}" + (f"-tp{tensor_parallel}" if tensor_parallel > 1 else "")


def _line_fit(sizes: F64, seconds: F64) -> tuple[float, float, Samples, StepCurve]:
    samples = Samples.of(sizes, np.zeros_like(sizes), seconds)
    curve, _ = fit_curve(samples, attention_s=0.0, max_knees=0)
    return curve.base_s, significant(1.0 / curve.per_unit_s), samples, curve


def fit_all_reduce(profiles_dir: Path) -> tuple[AllReduceFit, ...]:
    fits = []
    for tp in ALL_REDUCE_TPS:
        prof = read_collective_csv(profiles_dir / ALL_REDUCE_CSV, tp, tp)
        latency, bandwidth, samples, curve = _line_fit(prof.size_bytes, prof.median_s)
        error = fit_error(curve.seconds(samples.x, samples.w), samples.y, held_out(samples.config))
        source = f"Vidur {ALL_REDUCE_CSV} num_workers={tp}, per-size medians"
        fits.append(AllReduceFit(tp, latency, bandwidth, error, source))
    return tuple(fits)


def fit_links(profiles_dir: Path) -> tuple[LinkFit, ...]:
    fits = []
    for name, devices_per_node in LINK_SOURCES:
        prof = read_collective_csv(profiles_dir / SEND_RECV_CSV, 2, devices_per_node)
        setup, bandwidth, samples, curve = _line_fit(prof.size_bytes, prof.median_s)
        error = fit_error(curve.seconds(samples.x, samples.w), samples.y, held_out(samples.config))
        source = f"Vidur {SEND_RECV_CSV} devices_per_node={devices_per_node}, per-size medians"
        fits.append(LinkFit(name, setup, bandwidth, error, source))
    return tuple(fits)


def _config_ids(*columns: I64) -> I64:
    keys = np.stack(columns, axis=1)
    ids: I64 = np.unique(keys, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
    return ids


def splitwise_generated(prof: SplitwiseProfile) -> F64:
    """Tokens each request really generated: ``(e2e − prompt) / token_time`` (rows with a
    large ``token_size`` stop early, so ``token_size`` is not the count)."""
    out: F64 = (prof.e2e_s - prof.prompt_s) / prof.token_s
    return out


def splitwise_samples(prof: SplitwiseProfile) -> tuple[Samples, Samples]:
    """Prefill (``x = B·P``, ``w = B·P²``) and decode (``x = B``, ``w = B·(P + n/2)``)."""
    batch = prof.batch_size.astype(np.float64)
    prompt = prof.prompt_size.astype(np.float64)
    config = _config_ids(prof.prompt_size, prof.batch_size, prof.token_size)
    context = batch * (prompt + splitwise_generated(prof) / 2)
    prefill = Samples(batch * prompt, batch * prompt**2, prof.prompt_s, config)
    decode = Samples(batch, context, prof.token_s, config)
    return prefill, decode


def _splitwise_tp(prof: SplitwiseProfile, tp: int) -> SplitwiseProfile:
    keep = prof.tensor_parallel == tp
    for (ex_tp, ex_batch), _ in SPLITWISE_EXCLUDED.items():
        if ex_tp == tp:
            keep &= prof.batch_size != ex_batch
    return prof.select(keep)


def fit_splitwise(
    prof: SplitwiseProfile, bytes_per_s: float
) -> tuple[DecodeAttentionFit, tuple[ProfileFit, ...]]:
    """Llama-2-70B profiles, and the decode KV-read rate scored on (and fitted to) them."""
    name, hardware, model = SPLITWISE_MODEL
    shape = get_model(model)
    per_tp = [splitwise_samples(_splitwise_tp(prof, tp)) for tp in SPLITWISE_TPS]
    per_token = [float(kv_bytes_per_token_per_gpu(shape, tp)) for tp in SPLITWISE_TPS]
    fits = []
    for tp, (prefill, decode), kv_bytes in zip(SPLITWISE_TPS, per_tp, per_token, strict=True):
        prefill_curve, prefill_error = fit_curve(prefill)
        attention_s = significant(kv_bytes / bytes_per_s)
        decode_curve, decode_error = fit_curve(decode, attention_s=attention_s)
        fits.append(
            ProfileFit(
                name=profile_name(GPU, model, tp),
                gpu=GPU,
                model=model,
                tensor_parallel=tp,
                prefill=prefill_curve,
                decode=decode_curve,
                prefill_fit=prefill_error,
                decode_fit=decode_error,
                max_profiled_tokens=int(prefill.x.max()),
                max_profiled_batch=int(decode.x.max()),
                source=f"Splitwise {SPLITWISE_CSV} ({name}, {hardware}, tp{tp}), end to end",
            )
        )
    decodes = [decode for _, decode in per_tp]
    model_s = np.concatenate(
        [f.decode.seconds(d.x, d.w) for f, d in zip(fits, decodes, strict=True)]
    )
    measured = np.concatenate([d.y for d in decodes])
    holdout = np.concatenate([held_out(d.config) for d in decodes])
    free_bytes_per_s, _, free_error = fit_shared_attention(
        list(zip(decodes, per_token, strict=True))
    )
    attention = DecodeAttentionFit(
        bytes_per_s=bytes_per_s,
        source=(
            "LLMServingSim linear layers at 1 token (weight bytes per GPU / time), "
            "all fitted layer profiles"
        ),
        splitwise_fit=fit_error(model_s, measured, holdout),
        splitwise_free_bytes_per_s=free_bytes_per_s,
        splitwise_free_fit=free_error,
    )
    return attention, tuple(fits)


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


def _configs(prof: SplitwiseProfile, rows: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    pairs = zip(prof.batch_size[rows].tolist(), prof.prompt_size[rows].tolist(), strict=True)
    return sorted(set(pairs))


def cross_checks(
    profiles: tuple[ProfileFit, ...], splitwise: SplitwiseProfile
) -> tuple[CrossCheck, ...]:
    """Llama-3.1-70B (LLMServingSim) against Splitwise's measured Llama-2-70B at equal tp:
    batch-1 prefill over prompt sizes, and decode over batch sizes at 512-token prompts
    (medians of the repeats; 128 generated tokens)."""
    checks: list[CrossCheck] = []
    for profile in profiles:
        if profile.model != "llama-3.1-70b":
            continue
        tp = profile.tensor_parallel
        prof = _splitwise_tp(splitwise, tp)
        generated = splitwise_generated(prof)
        short = prof.token_size == 128
        points: list[tuple[str, int, int, float, float]] = []
        for batch, prompt in _configs(prof, short & (prof.batch_size == 1)):
            match = short & (prof.batch_size == batch) & (prof.prompt_size == prompt)
            x, w = np.array([batch * prompt], float), np.array([batch * prompt**2], float)
            model_s = float(profile.prefill.seconds(x, w)[0])
            points.append(
                ("prefill", batch, prompt, model_s, float(np.median(prof.prompt_s[match])))
            )
        for batch, prompt in _configs(prof, short & (prof.prompt_size == 512)):
            match = short & (prof.batch_size == batch) & (prof.prompt_size == prompt)
            context = prompt + float(np.mean(generated[match])) / 2
            x, w = np.array([batch], float), np.array([batch * context], float)
            model_s = float(profile.decode.seconds(x, w)[0])
            measured = float(np.median(prof.token_s[match]))
            points.append(("decode", batch, round(context), model_s, measured))
        checks.extend(
            CrossCheck(
                profile=profile.name,
                against=f"Splitwise {SPLITWISE_MODEL[0]} tp{tp}",
                phase=phase,
                batch_size=batch,
                tokens=tokens,
                model_s=significant(model_s, 4),
                measured_s=significant(measured, 4),
            )
            for phase, batch, tokens, model_s, measured in points
        )
    return tuple(checks)


def build_calibration(profiles_dir: Path) -> Calibration:
    """Every fit, from the profile CSVs under ``profiles_dir`` (``shared/profiles``)."""
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
    return Calibration(
        profiles=layer_fits + splitwise_fits,
        links=links,
        all_reduce=all_reduce,
        decode_attention=attention,
        cross_checks=cross_checks(layer_fits, splitwise),
    )
