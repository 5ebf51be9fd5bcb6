"""Prompts of an exact token count for a given tokenizer, and the replay plan of a trace.

:class:`PromptFactory` builds text that the model's tokenizer turns into exactly ``n``
tokens, special tokens included (vLLM tokenizes completion prompts with
``add_special_tokens=True``, so a tokenizer that adds ``<s>`` counts it). The text is a
sequence of *words*: vocabulary entries of the form ``" xyz"`` (a space and letters) that
the tokenizer encodes back into themselves alone. A byte-level pre-tokenizer splits text
at spaces before merging, so such words never merge across each other and ``k`` of them
are ``k`` tokens; every prompt is checked by encoding it, and adjusted if a tokenizer does
otherwise. Words come from a generator seeded per request (and, for traces with prefix
block ids such as Mooncake, per block, so prompts that share blocks share their text).

:func:`plan_requests` turns a trace into the requests to send: arrivals scaled and cut to
the run's duration, lengths capped so that prompt plus output fit the model's context.

Example::

    factory = PromptFactory(AutoTokenizer.from_pretrained(model_dir), seed=0)
    text = factory.build(300, key=7)
    assert len(factory.tokenizer(text).input_ids) == 300
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.traces import Trace

__all__ = ["MOONCAKE_BLOCK_TOKENS", "PromptError", "PromptFactory", "RequestPlan", "plan_requests"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

#: Tokens per prefix block id in the Mooncake trace.
MOONCAKE_BLOCK_TOKENS = 512
_WORD = re.compile(r"[a-z]{2,}")


class PromptError(ValueError):
    """A prompt of the asked length cannot be built; the message says why."""


class PromptFactory:
    """Builds prompts of exact token counts (see the module docstring)."""

    def __init__(self, tokenizer: Any, *, seed: int = 0, max_adjust: int = 8) -> None:
        self.tokenizer = tokenizer
        self.seed = seed
        self.max_adjust = max_adjust
        self.num_special = len(tokenizer("").input_ids)
        words = []
        for token, token_id in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
            text = tokenizer.convert_tokens_to_string([token])
            if (
                text.startswith(" ")
                and _WORD.fullmatch(text[1:])
                and tokenizer(text, add_special_tokens=False).input_ids == [token_id]
            ):
                words.append(text)
        if len(words) < 16:
            raise PromptError(
                f"the tokenizer has {len(words)} single-token words of the form ' abc'; "
                "at least 16 are needed to build prompts"
            )
        self.words = words

    def count(self, text: str) -> int:
        return len(self.tokenizer(text).input_ids)

    def _words(self, key: int, n: int) -> list[str]:
        rng = np.random.default_rng([self.seed, key])
        picks = rng.integers(0, len(self.words), size=n)
        return [self.words[i] for i in picks.tolist()]

    def build(self, num_tokens: int, *, key: int = 0, blocks: list[int] | None = None) -> str:
        """Text of exactly ``num_tokens`` tokens (special tokens included).

        ``key`` seeds the words; with ``blocks`` (prefix block ids), block *b* of
        :data:`MOONCAKE_BLOCK_TOKENS` tokens is seeded by its id instead, so requests
        sharing leading block ids share a prefix.
        """
        body = num_tokens - self.num_special
        if body < 1:
            raise PromptError(
                f"num_tokens must be > {self.num_special} (the tokenizer's special tokens), "
                f"got {num_tokens}"
            )
        if blocks:
            words: list[str] = []
            for b in blocks:
                if len(words) >= body:
                    break
                words.extend(self._words(1_000_003 + b, MOONCAKE_BLOCK_TOKENS))
            words.extend(self._words(key, max(0, body - len(words))))
            words = words[:body]
        else:
            words = self._words(key, body)
        text = "".join(words)
        spare = self._words(key + 7_919, self.max_adjust)
        for _ in range(self.max_adjust):
            have = self.count(text)
            if have == num_tokens:
                return text
            if have > num_tokens:
                text = text[: text.rstrip().rfind(" ")] if " " in text else text
            else:
                text += spare.pop()
        if self.count(text) == num_tokens:
            return text
        raise PromptError(
            f"could not build a prompt of exactly {num_tokens} tokens with this tokenizer "
            f"(got {self.count(text)} after {self.max_adjust} adjustments)"
        )


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """The requests of a run: send time (s after the start), prompt and output lengths.

    ``num_capped`` requests had their lengths cut to fit ``max_model_len``.
    """

    send_s: F64
    input_tokens: I64
    output_tokens: I64
    blocks: list[list[int]] | None
    max_model_len: int
    num_capped: int

    def __len__(self) -> int:
        return int(self.send_s.shape[0])


def plan_requests(
    trace: Trace,
    *,
    rate_scale: float,
    duration_s: float,
    max_model_len: int,
    start_s: float = 0.0,
    min_input_tokens: int = 2,
) -> RequestPlan:
    """The requests of ``trace`` arriving within ``duration_s`` (wall seconds) of the
    replay, at ``rate_scale`` times the trace's rate, starting ``start_s`` into the trace.

    Lengths are capped so that every request fits the model's context: the output to at
    most ``max_model_len // 2`` tokens (and at least 1), then the prompt to
    ``max_model_len - output`` (and at least ``min_input_tokens``).
    """
    if max_model_len < min_input_tokens + 1:
        raise PromptError(f"max_model_len must be > {min_input_tokens}, got {max_model_len}")
    window = trace.slice(start_s, duration_s * rate_scale).scaled(rate_scale)
    out = np.clip(window.output_tokens, 1, max_model_len // 2)
    inp = np.clip(window.input_tokens, min_input_tokens, max_model_len - out)
    # Outputs below 1 or prompts below the minimum are raised, not cut: count only cuts.
    cut = (window.output_tokens > out) | (window.input_tokens > inp)
    return RequestPlan(
        send_s=window.arrival_s,
        input_tokens=inp.astype(np.int64),
        output_tokens=out.astype(np.int64),
        blocks=window.hash_ids,
        max_model_len=max_model_len,
        num_capped=int(cut.sum()),
    )
