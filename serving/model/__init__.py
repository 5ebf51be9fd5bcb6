"""The tiny local model vLLM serves on machines without downloads (``goodput model build-tiny``)."""

from serving.model.tiny import (
    DEFAULT_MODEL_DIR,
    MANIFEST_NAME,
    ModelBuildError,
    TinyModelSpec,
    build_tiny_model,
    default_model_dir,
    is_complete,
    kv_bytes_per_token,
)

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
