"""Prompts of exact token counts, and the replay plan of a trace."""

from __future__ import annotations

import numpy as np
import pytest

from serving.bench.prompts import MOONCAKE_BLOCK_TOKENS, PromptError, PromptFactory, plan_requests
from serving.traces import Trace
from tests.unit.serving.bench.byte_bpe import ByteBPE


@pytest.fixture(scope="module")
def factory() -> PromptFactory:
    return PromptFactory(ByteBPE(), seed=3)


@pytest.mark.parametrize("n", [2, 3, 17, 128, 129, 1000])
def test_prompts_have_exactly_the_asked_tokens_special_ones_included(
    factory: PromptFactory, n: int
) -> None:
    text = factory.build(n, key=n)
    ids = factory.tokenizer(text).input_ids
    assert len(ids) == n and ids[0] == factory.tokenizer.tok.token_to_id("<s>")


def test_prompts_are_seeded(factory: PromptFactory) -> None:
    assert factory.build(50, key=1) == factory.build(50, key=1)
    assert factory.build(50, key=1) != factory.build(50, key=2)
    assert factory.build(50, key=1) != PromptFactory(factory.tokenizer, seed=4).build(50, key=1)


def test_shared_block_ids_give_shared_prefixes(factory: PromptFactory) -> None:
    n = 2 * MOONCAKE_BLOCK_TOKENS + 50
    a = factory.build(n, key=1, blocks=[7, 8, 9])
    b = factory.build(n, key=2, blocks=[7, 5, 9])
    common = a[: next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)]
    # The whole first block is shared (give or take a partial word at the boundary).
    assert len(factory.tokenizer(common).input_ids) >= MOONCAKE_BLOCK_TOKENS
    assert len(factory.tokenizer(a).input_ids) == len(factory.tokenizer(b).input_ids) == n


def test_too_short_prompts_are_refused(factory: PromptFactory) -> None:
    with pytest.raises(PromptError, match=r"num_tokens must be > 1 \(the tokenizer's special"):
        factory.build(1)


def trace(inputs: list[int], outputs: list[int], arrival: list[float]) -> Trace:
    return Trace(
        np.array(arrival, dtype=np.float64),
        np.array(inputs, dtype=np.int64),
        np.array(outputs, dtype=np.int64),
        name="t",
    )


def test_plan_scales_cuts_and_caps_to_the_context() -> None:
    t = trace([100, 3000, 500, 10, 1], [50, 100, 5000, 0, 1], [0.0, 1.0, 2.0, 3.0, 9.0])
    plan = plan_requests(t, rate_scale=2.0, duration_s=2.0, max_model_len=2048)
    # 2 s at 2x covers the first 4 s of the trace: 4 requests at half the times.
    assert plan.send_s.tolist() == [0.0, 0.5, 1.0, 1.5]
    assert plan.output_tokens.tolist() == [50, 100, 1024, 1]
    assert plan.input_tokens.tolist() == [100, 1948, 500, 10]
    assert plan.num_capped == 2 and plan.max_model_len == 2048
    assert plan.blocks is None


def test_plan_starts_into_the_trace() -> None:
    t = trace([5, 6, 7], [1, 1, 1], [0.0, 10.0, 11.0])
    plan = plan_requests(t, rate_scale=1.0, duration_s=5.0, max_model_len=64, start_s=9.0)
    assert plan.send_s.tolist() == [1.0, 2.0] and plan.input_tokens.tolist() == [6, 7]
