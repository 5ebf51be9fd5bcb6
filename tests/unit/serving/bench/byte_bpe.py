"""A small byte-level BPE tokenizer trained in memory, with the Hugging Face call API the
bench uses (``tok(text).input_ids``, ``get_vocab``, ``convert_tokens_to_string``)."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

_CORPUS = [
    "the quick brown fox jumps over the lazy dog while another fox sleeps",
    "return value from the function when the queue is empty and the loop ends",
    "class instance method attribute module package import export record batch",
] * 50


@dataclass
class Encoded:
    input_ids: list[int]


class ByteBPE:
    def __init__(self, vocab_size: int = 400) -> None:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(_CORPUS, trainer)
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
        self.tok = tok

    def __call__(self, text: str, add_special_tokens: bool = True) -> Encoded:
        return Encoded(self.tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def get_vocab(self) -> dict[str, int]:
        return self.tok.get_vocab()

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.tok.decode([self.tok.token_to_id(t) for t in tokens])
