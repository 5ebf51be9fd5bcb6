"""Splitwise's measured Llama-2-70B on H100 (tp 2/4/8): step samples, the fits, and the
cross-checks of the Llama-3.1-70B profiles against it.

``perf_model.csv`` times whole requests: ``prompt_time`` is the prefill of ``batch_size``
prompts of ``prompt_size`` tokens together, ``token_time`` the mean decode step that follows,
``e2e_time`` the whole request. Rows with a large ``token_size`` stop generating early, so
the tokens really generated are recovered from the times (:func:`splitwise_generated`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from serving.sim.calibration.fitting import (
    Samples,
    fit_curve,
    fit_error,
    fit_shared_attention,
    held_out,
    significant,
)
from serving.sim.calibration.profiles import SplitwiseProfile
from serving.sim.coefficients import (
    CrossCheck,
    DecodeAttentionFit,
    ProfileFit,
    profile_name,
)
from serving.sim.kv import kv_bytes_per_token_per_gpu
from serving.sim.models import get_model

__all__ = [
    "SPLITWISE_CSV",
    "SPLITWISE_EXCLUDED",
    "SPLITWISE_MODEL",
    "SPLITWISE_TPS",
    "cross_checks",
    "fit_splitwise",
    "splitwise_generated",
    "splitwise_samples",
    "splitwise_tp",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

GPU = "h100"
SPLITWISE_CSV = "splitwise/perf_model_h100_only.csv"
SPLITWISE_MODEL = ("llama2-70b", "h100-80gb", "llama-2-70b")  # (file's name, hardware, ours)
SPLITWISE_TPS = (2, 4, 8)

SPLITWISE_EXCLUDED: dict[tuple[int, int], str] = {
    (2, 64): (
        "tp2 batch 64 preempted: prompt_time falls 2.40 s -> 0.36 s from batch 32 and e2e "
        "jumps 9x; 64 x 640 tokens of KV (13.4 GB) beside 69 GB of weights per GPU overflow "
        "an 80 GB H100"
    ),
}
"""Splitwise (tensor parallelism, batch size) configurations left out, with the reason."""


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


def splitwise_tp(prof: SplitwiseProfile, tp: int) -> SplitwiseProfile:
    """The rows at tensor parallelism ``tp``, less :data:`SPLITWISE_EXCLUDED`."""
    keep = prof.tensor_parallel == tp
    for ex_tp, ex_batch in SPLITWISE_EXCLUDED:
        if ex_tp == tp:
            keep &= prof.batch_size != ex_batch
    return prof.select(keep)


def fit_splitwise(
    prof: SplitwiseProfile, bytes_per_s: float
) -> tuple[DecodeAttentionFit, tuple[ProfileFit, ...]]:
    """Llama-2-70B profiles, and the decode KV-read rate scored on (and fitted to) them."""
    name, hardware, model = SPLITWISE_MODEL
    shape = get_model(model)
    per_tp = [splitwise_samples(splitwise_tp(prof, tp)) for tp in SPLITWISE_TPS]
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
        prof = splitwise_tp(splitwise, tp)
        generated = splitwise_generated(prof)
        short = prof.token_size == 128
        points: list[tuple[str, int, int, float, float]] = []
        for batch, prompt in _configs(prof, short & (prof.batch_size == 1)):
            match = short & (prof.batch_size == batch) & (prof.prompt_size == prompt)
            model_s = profile.prefill.at(batch * prompt, batch * prompt**2)
            measured = float(np.median(prof.prompt_s[match]))
            points.append(("prefill", batch, prompt, model_s, measured))
        for batch, prompt in _configs(prof, short & (prof.prompt_size == 512)):
            match = short & (prof.batch_size == batch) & (prof.prompt_size == prompt)
            context = prompt + float(np.mean(generated[match])) / 2
            model_s = profile.decode.at(batch, batch * context)
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
