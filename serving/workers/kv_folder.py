"""The shared KV folder: which prompt folders are complete, and garbage collection.

vLLM's ExampleConnector keeps one folder per prompt, ``<root>/<hash>/<layer>.safetensors``
(``<hash>`` is the hex digest of the prompt's token ids cut to whole KV blocks; one file per
attention layer, each holding one ``kv_cache`` tensor). A decode instance treats the folder
as a hit as soon as it exists, and a missing or truncated layer file then kills its engine;
and nothing ever deletes a folder. This module makes completeness checkable and bounds the
folder:

* :func:`check_safetensors` — a layer file is complete when its header parses and the file
  is exactly header + the tensors' bytes (a truncated write fails this);
* :class:`KVFolder` — scans ``root``, checks each prompt folder (every expected layer file
  present and complete, all of one shape), removes folders by *renaming them away first*
  (``rename`` is atomic, so a reader sees the whole folder or nothing, never half of one),
  and collects garbage under a :class:`KVFolderPolicy` decided by the pure :func:`plan_gc`.

Our :class:`~serving.workers.kv_connector.AtomicExampleConnector` publishes only complete
folders (it stages under ``.staging``); these checks also cover folders written by the plain
connector, and clean up after writers that died.

Example::

    kv = KVFolder.for_model(Path("var/kv"), Path("var/models/tiny-llama"))
    kv.remove_incomplete(grace_s=0.0)      # after a prefill instance died
    result = kv.collect(KVFolderPolicy(max_age_s=600, max_bytes=1 << 30))
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import re
import shutil
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "STAGING_DIR_NAME",
    "TRASH_DIR_NAME",
    "GCResult",
    "KVFolder",
    "KVFolderPolicy",
    "KVFolderStatus",
    "check_safetensors",
    "expected_layer_files",
    "plan_gc",
]

logger = logging.getLogger(__name__)

STAGING_DIR_NAME = ".staging"  # AtomicExampleConnector's in-progress folders
TRASH_DIR_NAME = ".trash"  # folders renamed away, being deleted
_PROMPT_DIR = re.compile(r"^[0-9a-f]{16,128}$")
_MAX_HEADER_BYTES = 100 * 1024 * 1024
_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


def check_safetensors(header: bytes, file_size: int) -> tuple[str | None, str]:
    """Check a safetensors file from its first bytes (at least the 8-byte length and the
    JSON header) and its size. Returns ``(None, signature)`` when complete, where the
    signature (dtype and shape of every tensor) lets layers be compared, or
    ``(reason, "")`` when not."""
    if file_size < 8 or len(header) < 8:
        return f"file of {file_size} bytes has no header", ""
    (length,) = struct.unpack("<Q", header[:8])
    if length > _MAX_HEADER_BYTES or 8 + length > file_size:
        return f"header length {length} does not fit a file of {file_size} bytes", ""
    if len(header) < 8 + length:
        return f"header needs {8 + length} bytes, got {len(header)}", ""
    try:
        tensors = json.loads(header[8 : 8 + length])
    except ValueError:
        return "header is not valid JSON", ""
    if not isinstance(tensors, dict):
        return "header is not a JSON object", ""
    end = 0
    parts = []
    for name, info in sorted(tensors.items()):
        if name == "__metadata__":
            continue
        try:
            begin, stop = info["data_offsets"]
            shape = [int(d) for d in info["shape"]]
            width = _DTYPE_BYTES[info["dtype"]]
        except (KeyError, TypeError, ValueError):
            return f"tensor {name!r} has a malformed entry {info!r}", ""
        if stop - begin != math.prod(shape) * width:
            return f"tensor {name!r} spans {stop - begin} bytes, its shape needs more", ""
        end = max(end, stop)
        parts.append(f"{name}:{info['dtype']}{shape}")
    if not parts:
        return "no tensors", ""
    if file_size != 8 + length + end:
        return f"file has {file_size} bytes, header and tensors need {8 + length + end}", ""
    return None, ";".join(parts)


def expected_layer_files(model_dir: Path) -> frozenset[str]:
    """The layer files ExampleConnector writes for a decoder-only model from its
    ``config.json`` (vLLM names Llama-family attention layers
    ``model.layers.<i>.self_attn.attn``)."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    num_layers = int(config["num_hidden_layers"])
    return frozenset(f"model.layers.{i}.self_attn.attn.safetensors" for i in range(num_layers))


@dataclass(frozen=True, slots=True)
class KVFolderPolicy:
    """Bounds on the shared KV folder.

    ``max_age_s``: a complete folder not used for this long is removed. ``max_bytes``: when
    the folder holds more, the least recently used complete folders go first. ``min_age_s``:
    no complete folder younger than this is evicted for size (it covers the gateway's window
    between prefill and decode). ``incomplete_grace_s``: an incomplete or staging folder
    untouched this long has no live writer and is removed (a writer finishes a prompt in
    well under a second).
    """

    max_age_s: float = 600.0
    max_bytes: int = 1 << 30
    min_age_s: float = 30.0
    incomplete_grace_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_age_s", "min_age_s", "incomplete_grace_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0 seconds, got {value}")
        if self.max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {self.max_bytes}")
        if self.min_age_s > self.max_age_s:
            raise ValueError(
                f"min_age_s ({self.min_age_s}) must not exceed max_age_s ({self.max_age_s})"
            )


@dataclass(frozen=True, slots=True)
class KVFolderStatus:
    """One prompt folder (or staging folder): its size, last use, and completeness.

    ``last_used_time`` (wall clock) is the latest of the folder's and its files' modification
    and access times: publication, the last write, or a read the file system recorded.
    ``reason`` says why an incomplete folder is incomplete.
    """

    name: str
    num_bytes: int
    last_used_time: float
    complete: bool
    reason: str = ""
    staging: bool = False


@dataclass(frozen=True, slots=True)
class GCResult:
    num_removed: int = 0
    num_removed_incomplete: int = 0
    bytes_removed: int = 0
    num_kept: int = 0
    bytes_kept: int = 0


def plan_gc(
    folders: Sequence[KVFolderStatus], policy: KVFolderPolicy, now: float
) -> list[KVFolderStatus]:
    """Which folders to remove (pure): abandoned incomplete ones, then complete ones past
    ``max_age_s``, then the least recently used complete ones while over ``max_bytes``."""
    remove: list[KVFolderStatus] = []
    kept: list[KVFolderStatus] = []
    for folder in folders:
        age = now - folder.last_used_time
        if not folder.complete:
            if age >= policy.incomplete_grace_s:
                remove.append(folder)
            # A young incomplete folder may be mid-write: its bytes still count.
            continue
        if age >= policy.max_age_s:
            remove.append(folder)
        else:
            kept.append(folder)
    removed = {id(f) for f in remove}
    total = sum(f.num_bytes for f in folders if id(f) not in removed)
    for folder in sorted(kept, key=lambda f: (f.last_used_time, f.name)):
        if total <= policy.max_bytes:
            break
        if now - folder.last_used_time < policy.min_age_s:
            break  # the rest are younger still
        remove.append(folder)
        total -= folder.num_bytes
    return remove


class KVFolder:
    """The shared folder at ``root``. ``expected_layers`` is the set of layer file names a
    complete prompt folder holds (``None``: any non-empty set of complete, same-shape
    files). ``clock`` is the wall clock the file times are compared with.

    Thread-safe in the sense that matters: every removal is a ``rename`` away first, so
    concurrent scans and readers never see a half-deleted folder.
    """

    def __init__(
        self,
        root: Path,
        expected_layers: Iterable[str] | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = Path(root)
        self.expected_layers = None if expected_layers is None else frozenset(expected_layers)
        self._clock = clock
        self._serial = itertools.count()

    @classmethod
    def for_model(
        cls, root: Path, model_dir: Path, *, clock: Callable[[], float] = time.time
    ) -> KVFolder:
        """The folder at ``root`` holding KV of the model in ``model_dir``."""
        return cls(root, expected_layer_files(model_dir), clock=clock)

    def check(self, name: str) -> KVFolderStatus:
        """Size, last use and completeness of prompt folder ``name``."""
        return self._status(self.root / name, staging=False)

    def scan(self) -> list[KVFolderStatus]:
        """Every prompt folder and staging folder (other names are left alone)."""
        found: list[KVFolderStatus] = []
        for parent, staging in ((self.root, False), (self.root / STAGING_DIR_NAME, True)):
            try:
                entries = list(os.scandir(parent))
            except FileNotFoundError:
                continue
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if not staging and not _PROMPT_DIR.match(entry.name):
                    continue
                try:
                    found.append(self._status(Path(entry.path), staging=staging))
                except FileNotFoundError:
                    continue  # removed while we looked
        return found

    def remove(self, folder: KVFolderStatus | str) -> int:
        """Remove one folder (rename away, then delete); the bytes freed (0 if gone)."""
        status = folder if isinstance(folder, KVFolderStatus) else self.check(folder)
        parent = self.root / STAGING_DIR_NAME if status.staging else self.root
        trash = self.root / TRASH_DIR_NAME
        trash.mkdir(parents=True, exist_ok=True)
        target = trash / f"{status.name}.{os.getpid()}.{next(self._serial)}"
        try:
            os.rename(parent / status.name, target)
        except FileNotFoundError:
            return 0
        shutil.rmtree(target, ignore_errors=True)
        return status.num_bytes

    def remove_incomplete(self, grace_s: float = 0.0) -> GCResult:
        """Remove incomplete and staging folders untouched for ``grace_s`` (after a writer
        died: nothing else is writing them)."""
        now = self._clock()
        doomed = [f for f in self.scan() if not f.complete and now - f.last_used_time >= grace_s]
        return self._remove_all(doomed)

    def collect(self, policy: KVFolderPolicy) -> GCResult:
        """One garbage-collection pass under ``policy``."""
        self._empty_trash()
        return self._remove_all(plan_gc(self.scan(), policy, self._clock()))

    def _remove_all(self, doomed: list[KVFolderStatus]) -> GCResult:
        removed = removed_incomplete = freed = 0
        for folder in doomed:
            num_bytes = self.remove(folder)
            removed += 1
            removed_incomplete += not folder.complete
            freed += num_bytes
        left = self.scan()
        if removed:
            logger.info(
                "KV folder %s: removed %d folders (%d incomplete, %d bytes)",
                self.root,
                removed,
                removed_incomplete,
                freed,
            )
        return GCResult(
            num_removed=removed,
            num_removed_incomplete=removed_incomplete,
            bytes_removed=freed,
            num_kept=len(left),
            bytes_kept=sum(f.num_bytes for f in left),
        )

    def _empty_trash(self) -> None:
        trash = self.root / TRASH_DIR_NAME
        if trash.is_dir():
            for entry in os.scandir(trash):
                shutil.rmtree(entry.path, ignore_errors=True)

    def _status(self, path: Path, *, staging: bool) -> KVFolderStatus:
        info = path.stat()
        last_used = max(info.st_mtime, info.st_atime if not staging else 0.0)
        num_bytes = 0
        reasons: list[str] = []
        signatures: set[str] = set()
        names: set[str] = set()
        for entry in os.scandir(path):
            stat = entry.stat(follow_symlinks=False)
            num_bytes += stat.st_size
            last_used = max(last_used, stat.st_mtime, stat.st_atime)
            names.add(entry.name)
            if staging or not entry.name.endswith(".safetensors"):
                continue
            reason, signature = check_safetensors(_read_header(entry.path), stat.st_size)
            if reason is not None:
                reasons.append(f"{entry.name}: {reason}")
            signatures.add(signature)
        if staging:
            reasons.append("staging folder")
        elif self.expected_layers is not None:
            missing = sorted(self.expected_layers - names)
            if missing:
                reasons.append(f"missing layer files {missing}")
        elif not names:
            reasons.append("empty folder")
        if not reasons and len(signatures) > 1:
            reasons.append(f"layers differ in shape: {sorted(signatures)}")
        return KVFolderStatus(
            name=path.name,
            num_bytes=num_bytes,
            last_used_time=last_used,
            complete=not reasons,
            reason="; ".join(reasons),
            staging=staging,
        )


def _read_header(path: str) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file. Opened with
    ``O_NOATIME`` where allowed, so that checking a folder does not count as using it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOATIME", 0))
    except PermissionError:  # O_NOATIME needs the file's owner
        fd = os.open(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as layer:
        head = layer.read(8)
        if len(head) == 8:
            (length,) = struct.unpack("<Q", head)
            head += layer.read(min(length, _MAX_HEADER_BYTES))
    return head
