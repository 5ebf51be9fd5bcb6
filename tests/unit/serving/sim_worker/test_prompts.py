"""Token counting, prompt identity and the filler answer of the sim worker."""

from __future__ import annotations

import pytest

from serving.sim.worker.prompts import (
    CHAT_TOKENS_PER_MESSAGE,
    PromptError,
    PromptInfo,
    answer_length,
    filler_text,
    parse_chat_prompt,
    parse_completion_prompt,
    word_prompt,
)


def completion(body: dict[str, object], block: int = 512) -> PromptInfo:
    return parse_completion_prompt(body, block_tokens=block)


def test_text_counts_words_plus_bos_and_token_ids_exactly() -> None:
    assert completion({"prompt": "one two  three\nfour"}).tokens == 5
    assert completion({"prompt": [5, 6, 7]}).tokens == 3
    assert completion({"prompt": [[5, 6, 7]]}).tokens == 3  # a batch of one
    assert completion({"prompt": "x", "prompt_token_ids": [1, 2]}).tokens == 2


def test_word_prompt_is_counted_as_asked_and_never_shares_a_prefix() -> None:
    for n in (2, 3, 600, 1500):
        assert completion({"prompt": word_prompt(n, key=7)}).tokens == n
    a, b = (
        completion({"prompt": word_prompt(1100, 1)}),
        completion({"prompt": word_prompt(1100, 2)}),
    )
    assert len(a.block_ids) == 2 and not set(a.block_ids) & set(b.block_ids)
    with pytest.raises(PromptError, match="num_tokens"):
        word_prompt(1, 0)


def test_same_prompt_same_key_and_chained_block_ids() -> None:
    ids = list(range(1200))
    a, b = completion({"prompt": ids}), completion({"prompt": ids})
    assert a.key == b.key and a.block_ids == b.block_ids
    assert len(a.block_ids) == 1200 // 512
    # A prompt sharing the first block shares the first id only (ids chain the prefix).
    c = completion({"prompt": ids[:512] + [9] * 700})
    assert c.block_ids[0] == a.block_ids[0] and c.block_ids[1] != a.block_ids[1]
    assert completion({"prompt": "1 2 3"}).key != completion({"prompt": [1, 2, 3]}).key


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [1, True]}, "prompt"),
        ({}, "prompt"),
        ({"prompt_token_ids": "1 2"}, "prompt_token_ids"),
    ],
)
def test_bad_prompts_name_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(PromptError, match=f"^{field}: expected one prompt"):
        completion(body)


def test_chat_counts_contents_and_template_tokens() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello there you"}]},
        ]
    }
    info = parse_chat_prompt(body, block_tokens=512)
    assert info.tokens == 5 + 2 * CHAT_TOKENS_PER_MESSAGE + 1
    with pytest.raises(PromptError, match=r"^messages\[0\]"):
        parse_chat_prompt({"messages": [{"content": "x"}]}, block_tokens=512)
    with pytest.raises(PromptError, match=r"^messages: expected a non-empty list"):
        parse_chat_prompt({"messages": []}, block_tokens=512)


def test_answer_length_honours_max_min_and_ignore_eos() -> None:
    info = completion({"prompt": "a b c"})
    natural = answer_length(info, max_tokens=10_000, min_tokens=0, ignore_eos=False)
    assert 16 <= natural <= 256
    assert answer_length(info, max_tokens=10_000, min_tokens=0, ignore_eos=True) == 10_000
    assert answer_length(info, max_tokens=5, min_tokens=0, ignore_eos=False) == 5
    assert answer_length(info, max_tokens=900, min_tokens=800, ignore_eos=False) == 800


def test_filler_is_deterministic_and_one_word_per_token() -> None:
    info = completion({"prompt": "a b c"})
    text = filler_text(info, 0, 6)
    assert text == filler_text(info, 0, 3) + filler_text(info, 3, 3)
    assert len(text.split()) == 6
