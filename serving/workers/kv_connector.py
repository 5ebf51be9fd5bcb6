"""ExampleConnector with atomic publication: a prompt's KV folder appears whole or not at all.

Loaded *inside* vLLM (``kv_connector_module_path``, see :mod:`serving.workers.config`);
imports vLLM and torch, so nothing else imports this module.

vLLM's ``ExampleConnector`` writes ``<shared>/<hash>/<layer>.safetensors`` one layer at a
time during the forward pass, and another instance treats the folder as a hit as soon as
the *folder* exists. A reader that comes while layers are still being written, or after
the writer died half-way, loads a missing or truncated layer, and that kills its engine
(shared/notes/vllm-cpu.md). Here the layers of a step go to
``<shared>/.staging/<hash>.<pid>.<n>`` instead, and ``wait_for_save`` (called once the
step's forward pass ends) renames each staged folder to ``<shared>/<hash>`` — one atomic
``rename`` on the same file system — only when every attention layer of the model is there.
A staged folder missing a layer (the forward pass raised) is deleted, and a dead writer
leaves only staging folders, which no reader ever looks at and the KV folder GC removes.
Loading and matching are ExampleConnector's own, so the on-disk layout is unchanged and
instances running the plain connector can read what this one publishes.

Transfers are timed and reported through vLLM's connector-stats path
(:mod:`serving.vllm_plugin.kv_transfer`): each published prompt is one *save* (the time of
its layer writes in the forward pass plus the ``rename``, and its tensor bytes), each prompt
loaded from the shared folder one *load* (the time ``start_load_kv`` spent reading and
injecting its layers, which the step waits for, and its tensor bytes). The worker-side
instance collects them; vLLM ships them to the API server's stat loggers, where the goodput
plugin exports them on ``/metrics``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from serving.vllm_plugin.kv_transfer import KVTransferStats

__all__ = ["STAGING_DIR_NAME", "AtomicExampleConnector", "AtomicExampleConnectorStats"]

logger = logging.getLogger(__name__)

STAGING_DIR_NAME = ".staging"


class AtomicExampleConnectorStats(KVTransferStats, KVConnectorStats):
    """:class:`~serving.vllm_plugin.kv_transfer.KVTransferStats` as vLLM's stats type."""


def tensor_bytes(path: str) -> int:
    """The tensor data bytes of a safetensors file (its size less its header), 0 if unreadable.

    A safetensors file is an 8-byte little-endian header length, the JSON header, then the
    tensors' bytes.
    """
    try:
        with open(path, "rb") as f:
            header = int.from_bytes(f.read(8), "little")
            return max(0, os.fstat(f.fileno()).st_size - 8 - header)
    except OSError:
        return 0


class AtomicExampleConnector(ExampleConnector):
    """``ExampleConnector`` whose stores are staged, then published with one ``rename``."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._staging_root = os.path.join(self._storage_path, STAGING_DIR_NAME)
        self._saving = False
        self._staged: dict[str, tuple[str, set[str]]] = {}  # final folder -> (staged, layers)
        self._serial = itertools.count()
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or ()
        self._layer_names = frozenset(name for group in groups for name in group.layer_names)
        self._stats = AtomicExampleConnectorStats()
        self._save_s: dict[str, float] = {}  # final folder -> seconds of its layer writes
        self._current_final = ""
        self._loaded_files: list[str] = []

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        """ExampleConnector's metadata without the stores of a prompt's first chunk.

        ExampleConnector stores a new request's KV in the step that schedules it, under the
        hash of its whole prompt; under chunked prefill (a step's token budget shared by
        several prompts) that step computes only the first blocks, and a reader that later
        finds the folder allocates the whole prompt but loads fewer tokens — a shape
        mismatch that kills its engine. Such a store is dropped: the prompt is then not
        published, and a decode instance computes it itself (missing KV is graceful).
        """
        meta: Any = super().build_connector_meta(scheduler_output)
        requests = getattr(meta, "requests", None)
        if requests:
            partial = [
                r for r in requests if r.is_store and r.slot_mapping.numel() < r.token_ids.numel()
            ]
            if partial:
                logger.debug("not storing %d partially computed prompts", len(partial))
                meta.requests = [r for r in requests if not any(r is p for p in partial)]
        return meta

    @contextlib.contextmanager
    def _only(self, request: Any) -> Iterator[None]:
        """ExampleConnector's per-step work restricted to one request (to time it alone)."""
        meta = self._connector_metadata
        self._connector_metadata = ExampleConnectorMetadata(requests=[request])
        try:
            yield
        finally:
            self._connector_metadata = meta

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta: Any = self._get_connector_metadata()
        loads = [r for r in getattr(meta, "requests", ()) if not r.is_store]
        if not loads or forward_context.attn_metadata is None:
            super().start_load_kv(forward_context, **kwargs)
            return
        for request in loads:
            self._loaded_files = []
            start_ts = time.perf_counter()
            with self._only(request):
                super().start_load_kv(forward_context, **kwargs)
            elapsed_s = time.perf_counter() - start_ts
            if self._loaded_files:
                self._stats.record_load(elapsed_s, sum(map(tensor_bytes, self._loaded_files)))

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        meta: Any = self._get_connector_metadata()
        stores = [r for r in getattr(meta, "requests", ()) if r.is_store]
        self._saving = True
        try:
            for request in stores:
                self._current_final = ""
                start_ts = time.perf_counter()
                with self._only(request):
                    super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
                elapsed_s = time.perf_counter() - start_ts
                final = self._current_final  # set by _generate_filename_debug
                if final:
                    self._save_s[final] = self._save_s.get(final, 0.0) + elapsed_s
        finally:
            self._saving = False

    def _generate_filename_debug(
        self, layer_name: str, token_ids: Any, mm_hashes: list[str]
    ) -> str:
        if not self._saving:  # loads read the published folder
            path = super()._generate_filename_debug(layer_name, token_ids, mm_hashes)
            self._loaded_files.append(path)
            return path
        final = self._generate_foldername_debug(token_ids, mm_hashes, create_folder=False)
        self._current_final = final
        entry = self._staged.get(final)
        if entry is None:
            name = f"{os.path.basename(final)}.{os.getpid()}.{next(self._serial)}"
            staged = os.path.join(self._staging_root, name)
            os.makedirs(staged, exist_ok=True)
            entry = self._staged[final] = (staged, set())
        entry[1].add(layer_name)
        return os.path.join(entry[0], f"{layer_name}.safetensors")

    def wait_for_save(self) -> None:
        super().wait_for_save()  # type: ignore[no-untyped-call]
        staged, self._staged = self._staged, {}
        save_s, self._save_s = self._save_s, {}
        for final, (folder, layers) in staged.items():
            if self._layer_names and not self._layer_names <= layers:
                missing = sorted(self._layer_names - layers)
                logger.warning("discarding KV folder %s: layers %s were not saved", folder, missing)
                shutil.rmtree(folder, ignore_errors=True)
                continue
            start_ts = time.perf_counter()
            num_bytes = sum(
                tensor_bytes(os.path.join(folder, f"{layer}.safetensors")) for layer in layers
            )
            try:
                os.rename(folder, final)
            except OSError:
                # Another instance published the same prompt first: theirs is complete too.
                shutil.rmtree(folder, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.utime(final)  # the folder's mtime is its publication time (for GC)
            elapsed_s = save_s.get(final, 0.0) + time.perf_counter() - start_ts
            self._stats.record_save(elapsed_s, num_bytes)

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """The transfers since the last call (the worker-side instance's; None if none)."""
        if self._stats.is_empty():
            return None
        return self._stats.clone_and_reset()

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats:
        return AtomicExampleConnectorStats(data=data or {})
