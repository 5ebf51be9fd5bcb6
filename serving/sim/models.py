"""Model shapes: the few numbers of a Llama-style decoder that set its KV cache and weight sizes.

Shapes come from each model's Hugging Face ``config.json`` (``num_hidden_layers``,
``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
``vocab_size``); head dim is ``hidden_size / num_attention_heads`` (128 for the five Llamas,
64 for ``tiny-llama``, the local test model of ``serving/model/tiny.py``).
Llama-2-7B has no grouped-query attention (32 KV heads), the others have 8 KV heads.

Example::

    shape = get_model("llama-3.1-8b")
    shape.num_layers, shape.num_kv_heads, shape.head_dim   # (32, 8, 128)
    round(shape.num_params / 1e9, 2)                         # 8.03
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODELS", "ModelShape", "get_model"]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A Llama-style decoder-only transformer (RMSNorm, RoPE, SwiGLU MLP, untied LM head)."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    def __post_init__(self) -> None:
        for field in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
        ):
            value = getattr(self, field)
            if value < 1:
                raise ValueError(f"{self.name}: {field} must be >= 1, got {value}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"{self.name}: num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def num_params(self) -> int:
        """Parameters: embedding + layers (attention, MLP, two norms) + final norm + LM head."""
        h = self.hidden_size
        q_dim = self.num_attention_heads * self.head_dim
        kv_dim = self.num_kv_heads * self.head_dim
        attention = h * q_dim + 2 * h * kv_dim + q_dim * h
        mlp = 3 * h * self.intermediate_size
        per_layer = attention + mlp + 2 * h
        return 2 * self.vocab_size * h + self.num_layers * per_layer + h

    def weight_bytes(self, bytes_per_param: int = 2) -> int:
        """Bytes of the weights (``bytes_per_param`` 2 for BF16/FP16)."""
        return self.num_params * bytes_per_param


_SHAPES = (
    ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    ModelShape("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256),
    ModelShape("llama-3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256),
    ModelShape("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000),
    ModelShape("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000),
    # The tiny random-weight model vLLM serves on this CPU machine (serving/model/tiny.py).
    ModelShape("tiny-llama", 2, 256, 4, 4, 64, 688, 2048),
)

MODELS: dict[str, ModelShape] = {shape.name: shape for shape in _SHAPES}
"""Every known shape by name (lower case, as in the profile names)."""


def get_model(name: str) -> ModelShape:
    """The shape named ``name``; a ``KeyError`` names the known models otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise KeyError(f"unknown model {name!r}; known models: {known}") from None
