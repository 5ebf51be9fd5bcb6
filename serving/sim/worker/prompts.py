"""What a sim worker reads from a request body: the prompt's size, its identity, its output.

The sim worker has no tokenizer (it stands for an H100 engine whose model it does not
run), so it counts tokens cheaply and deterministically:

* **token ids** (``prompt`` as a list of ints on ``/v1/completions``, or
  ``prompt_token_ids``): exactly their number;
* **text**: one token per whitespace-separated word, plus one for the ``<s>`` a Llama
  tokenizer prepends. ``goodput bench``'s prompts are words that are one token each with
  ``<s>`` counted, so a replayed trace keeps its input lengths exactly; for English text
  this reads about 1.3× low (BPE tokens per word);
* **chat**: the words of every message's text plus 4 tokens per message (the template's
  role markers) plus 1.

Two prompts with the same text or ids have the same :attr:`PromptInfo.key` (the KV
hand-off between a prefill and a decode worker finds the prompt by it) and the same
prefix-cache block ids (:attr:`PromptInfo.block_ids`, chained hashes of whole blocks of
``prefix_block_tokens`` tokens, as vLLM's prefix cache hashes its blocks).

Outputs are filler: token *i* of a request is one word of :data:`FILLER_WORDS`, picked by
the prompt's key, so the same request gives the same text. Without ``ignore_eos`` the
filler "model" ends its answer (finish reason ``stop``) after 16–256 tokens, a function of
the prompt; ``max_tokens`` cuts it first (``length``); ``min_tokens`` postpones the end.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHAT_TOKENS_PER_MESSAGE",
    "FILLER_WORDS",
    "PromptError",
    "PromptInfo",
    "answer_length",
    "filler_text",
    "parse_chat_prompt",
    "parse_completion_prompt",
    "word_prompt",
]

BOS_TOKENS = 1
CHAT_TOKENS_PER_MESSAGE = 4
FILLER_WORDS = (
    " the", " model", " answers", " with", " filler", " tokens", " on", " a", " modelled",
    " schedule", " from", " fitted", " H100", " step", " times", " and", " nothing", " else",
)  # fmt: skip
_EOS_MIN, _EOS_SPAN = 16, 241


class PromptError(ValueError):
    """A request body whose prompt the worker cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class PromptInfo:
    """A prompt's token count, identity (``key``, hex) and prefix-cache block ids."""

    tokens: int
    key: str
    block_ids: tuple[int, ...]

    @property
    def seed(self) -> int:
        return int(self.key[:15], 16)


def _units_and_key(units: list[str] | list[int], kind: str, block_tokens: int) -> PromptInfo:
    """``units`` are the prompt's tokens (ids, or words standing for tokens)."""
    digest = hashlib.blake2b(kind.encode(), digest_size=16)
    blocks: list[int] = []
    chain = b""
    n = len(units)
    for start in range(0, n - n % block_tokens, block_tokens):
        part = json.dumps(units[start : start + block_tokens], separators=(",", ":")).encode()
        chain = hashlib.blake2b(chain + part, digest_size=8).digest()
        blocks.append(int.from_bytes(chain, "big") >> 1)  # non-negative int64
    digest.update(json.dumps(units, separators=(",", ":")).encode())
    return PromptInfo(0, digest.hexdigest(), tuple(blocks))


def parse_completion_prompt(body: dict[str, Any], *, block_tokens: int) -> PromptInfo:
    """The prompt of a ``/v1/completions`` body (``prompt`` or ``prompt_token_ids``)."""
    ids = body.get("prompt_token_ids")
    prompt = body.get("prompt") if ids is None else ids
    field = "prompt" if ids is None else "prompt_token_ids"
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str) and ids is None:
        words = prompt.split()
        info = _units_and_key(words, "text", block_tokens)
        return PromptInfo(len(words) + BOS_TOKENS, info.key, info.block_ids)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        info = _units_and_key(prompt, "ids", block_tokens)
        return PromptInfo(len(prompt), info.key, info.block_ids)
    raise PromptError(
        f"{field}: expected one prompt, a string or a non-empty list of token ids (ints >= 0); "
        f"got {type(prompt).__name__}"
        + (f" of {len(prompt)} items" if isinstance(prompt, list) else "")
    )


def parse_chat_prompt(body: dict[str, Any], *, block_tokens: int) -> PromptInfo:
    """The prompt of a ``/v1/chat/completions`` body (its ``messages``)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages: expected a non-empty list of {role, content} objects")
    words: list[str] = []
    for k, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise PromptError(f"messages[{k}]: expected an object with a string 'role'")
        content = message.get("content")
        if content is None:
            continue
        if isinstance(content, str):
            texts = [content]
        elif isinstance(content, list):
            texts = [p.get("text", "") for p in content if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in texts):
                raise PromptError(f"messages[{k}].content: text parts must hold strings")
        else:
            raise PromptError(
                f"messages[{k}].content: expected a string or a list of parts, "
                f"got {type(content).__name__}"
            )
        words.append(f"<{message['role']}>")
        for text in texts:
            words.extend(text.split())
    info = _units_and_key(words, "chat", block_tokens)
    count = len(words) - len(messages) + CHAT_TOKENS_PER_MESSAGE * len(messages) + BOS_TOKENS
    return PromptInfo(max(count, 1), info.key, info.block_ids)


def answer_length(prompt: PromptInfo, *, max_tokens: int, min_tokens: int, ignore_eos: bool) -> int:
    """How many tokens the filler model answers ``prompt`` with (module docstring)."""
    if ignore_eos:
        return max_tokens
    eos = _EOS_MIN + prompt.seed % _EOS_SPAN
    return min(max_tokens, max(eos, min_tokens))


def filler_text(prompt: PromptInfo, start: int, count: int) -> str:
    """The text of output tokens ``start .. start + count - 1`` of ``prompt``'s answer."""
    n = len(FILLER_WORDS)
    offset = prompt.seed % n
    return "".join(FILLER_WORDS[(offset + i) % n] for i in range(start, start + count))


def word_prompt(num_tokens: int, key: int) -> str:
    """Text the sim worker counts as exactly ``num_tokens`` tokens (``num_tokens - 1``
    words after ``<s>``), distinct for each ``key`` (no accidental prefix-cache hits)."""
    if num_tokens < 2:
        raise PromptError(
            f"num_tokens: a text prompt has >= 2 tokens (<s> and a word), got {num_tokens}"
        )
    return " ".join(f"w{key}x{i}" for i in range(num_tokens - 1))
