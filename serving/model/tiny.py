"""A tiny random-weight Llama and its tokenizer, built locally: vLLM's model for this machine.

Nothing can be downloaded here, so :func:`build_tiny_model` makes a model vLLM serves like
any Hugging Face checkpoint: a ``LlamaForCausalLM`` (2 layers, hidden 256, 4 heads of dim
64, vocabulary 2,048, 2,048 positions) with weights drawn from a seeded generator, saved as
bf16 safetensors (about 5 MB), and a byte-level BPE tokenizer trained with ``tokenizers``
on a fixed list of Python standard-library sources, wrapped in ``PreTrainedTokenizerFast``
with ``<s>``/``</s>``/``<pad>`` and a small chat template. Its text is random; send
``"ignore_eos": true`` to get exactly ``max_tokens`` tokens.

Deterministic: the same seed (and the same Python and library versions) gives the same
bytes in every file. Cached: the folder is written under a temporary name and renamed into
place, with a manifest (:data:`MANIFEST_NAME`) written last; a later call that finds a
complete folder built with the same spec returns at once.

Example::

    model_dir = build_tiny_model(Path("var/models/tiny-llama"), seed=0)
    # python -m vllm.entrypoints.openai.api_server --model var/models/tiny-llama
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MODEL_DIR",
    "MANIFEST_NAME",
    "ModelBuildError",
    "TinyModelSpec",
    "build_tiny_model",
    "default_model_dir",
    "is_complete",
    "kv_bytes_per_token",
]

MANIFEST_NAME = "goodput-model.json"
BUILDER = "goodput-tiny-llama"
BUILDER_VERSION = 1
DEFAULT_MODEL_DIR = Path("var") / "models" / "tiny-llama"
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Training text: standard-library modules present in every CPython 3.11+ install.
CORPUS_MODULES = (
    "argparse.py",
    "ast.py",
    "asyncio/base_events.py",
    "collections/__init__.py",
    "dataclasses.py",
    "email/message.py",
    "enum.py",
    "functools.py",
    "http/client.py",
    "inspect.py",
    "json/decoder.py",
    "logging/__init__.py",
    "pathlib.py",
    "string.py",
    "subprocess.py",
    "textwrap.py",
    "typing.py",
    "unittest/case.py",
    "urllib/parse.py",
)


class ModelBuildError(RuntimeError):
    """The model cannot be built at the given place; the message says why."""


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    """The architecture; the defaults are the model every test and demo uses."""

    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    head_dim: int = 64
    max_position_embeddings: int = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden_size != self.num_attention_heads * self.head_dim:
            raise ModelBuildError(
                f"hidden_size must equal num_attention_heads × head_dim "
                f"({self.num_attention_heads} × {self.head_dim}), got {self.hidden_size}"
            )
        if self.vocab_size < 512:
            raise ModelBuildError(f"vocab_size must be >= 512, got {self.vocab_size}")
        if self.seed < 0:
            raise ModelBuildError(f"seed must be >= 0, got {self.seed}")


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int = 2) -> int:
    """KV-cache bytes one token takes across all layers, from a model's ``config.json``:
    2 (K and V) × layers × KV heads × head dim × bytes per element."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes


def default_model_dir(repo_root: Path | None = None) -> Path:
    """``var/models/tiny-llama`` under the repository (``var/`` is gitignored)."""
    root = repo_root or Path(__file__).resolve().parents[2]
    return root / DEFAULT_MODEL_DIR


def _manifest(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_complete(directory: Path, spec: TinyModelSpec | None = None) -> bool:
    """Whether ``directory`` holds a finished build (of ``spec``, when given): the manifest
    is there and every file it lists has its recorded size."""
    manifest = _manifest(directory)
    if manifest is None or manifest.get("builder") != BUILDER:
        return False
    if manifest.get("version") != BUILDER_VERSION:
        return False
    if spec is not None and manifest.get("spec") != asdict(spec):
        return False
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for name, info in files.items():
        try:
            if (directory / name).stat().st_size != info["bytes"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return True


def build_tiny_model(directory: Path, spec: TinyModelSpec | None = None) -> Path:
    """Build the model into ``directory`` unless a complete build of ``spec`` is there.

    An earlier build with another spec, or an unfinished one, is replaced. A folder that
    is not a build of ours and is not empty is refused (:class:`ModelBuildError`), so a
    typo never deletes someone's files. Returns ``directory``.
    """
    spec = spec or TinyModelSpec()
    directory = Path(directory)
    if is_complete(directory, spec):
        return directory
    if directory.exists():
        ours = _manifest(directory) is not None
        if not directory.is_dir() or (any(directory.iterdir()) and not ours):
            raise ModelBuildError(
                f"{directory} exists and is not a tiny-model build; choose an empty or new folder"
            )
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.with_name(f".{directory.name}.building-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        _write_model(staging, spec)
        _write_tokenizer(staging, spec)
        _write_manifest(staging, spec)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for name in CORPUS_MODULES:
        path = stdlib / name
        if path.is_file():
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    if not texts:
        raise ModelBuildError(f"no training text found under {stdlib}")
    return texts


def _write_tokenizer(directory: Path, spec: TinyModelSpec) -> None:
    # One thread: BPE merge ties are then broken in the same order on every run.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=spec.max_position_embeddings,
        chat_template=CHAT_TEMPLATE,
    )
    wrapped.save_pretrained(str(directory))


def _write_model(directory: Path, spec: TinyModelSpec) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        tie_word_embeddings=False,
        bos_token_id=SPECIAL_TOKENS.index("<s>"),
        eos_token_id=SPECIAL_TOKENS.index("</s>"),
        pad_token_id=SPECIAL_TOKENS.index("<pad>"),
        dtype="bfloat16",
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.bfloat16().save_pretrained(str(directory))


def _write_manifest(directory: Path, spec: TinyModelSpec) -> None:
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        files[path.relative_to(directory).as_posix()] = {
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    manifest = {
        "builder": BUILDER,
        "version": BUILDER_VERSION,
        "spec": asdict(spec),
        "files": files,
    }
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
