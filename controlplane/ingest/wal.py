"""The write-ahead log of accepted batches: what makes an acknowledgement durable.

Every batch the ingestor takes is appended here *before* the engine counts it, and the
answer waits until the log is on disk (``fsync``), so an acknowledged record survives a
``kill -9`` of the control plane. At start the log is replayed into the engine, exactly
once (design, checkpoint and costs: ``docs/goodput-engine.md``, *Durability*).

* **Segments.** The log is a folder of files ``<epoch>-<k>.wal`` (``k`` = 0, 1, 2, …). Each
  rollup cycle seals the current segment and opens the next (:meth:`rotate`) under the
  ingest lock, so a segment holds exactly the batches between two cuts.
* **Entries.** ``[u32 length][u32 crc32][payload]``: the payload is a msgpack map (the
  batch's identity, its wire bytes as received, the rows refused by the screen). A torn
  last entry (a crash mid-write) fails its length or CRC and ends the replay of its segment;
  it was never acknowledged.
* **Group commit.** :meth:`append` writes under the caller's lock; :meth:`sync` waits,
  outside it, for an ``fsync`` covering the entry (``fdatasync``: the data and the file's
  size, not its times). Concurrent requests share one: a request that finds a sync running
  waits for it, and is usually covered by it.
* **Fail-stop.** A failed write or ``fsync`` leaves the log :attr:`failed`: nothing more is
  acknowledged (ingest answers 503) until the process restarts and replays.
* **One owner.** An exclusive ``flock`` on the folder's lock file: a second process that
  points at the same folder fails at start instead of interleaving its entries.
* **Epochs.** The database's checkpoint row names the log's epoch; segments of another epoch
  (a database that was reset, another deployment's folder) are deleted at start, never
  replayed into the wrong history.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack

__all__ = ["WalError", "WalSegment", "WriteAheadLog", "decode_entry", "encode_entry"]

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")
_NAME = re.compile(r"^(?P<epoch>[0-9a-f]{32})-(?P<k>\d{12})\.wal$")
#: An entry larger than this is corrupt (a batch is at most max_ingest_bytes).
MAX_ENTRY_BYTES = 1 << 30


class WalError(RuntimeError):
    """The log cannot take or keep an entry (disk full, I/O error, or failed before)."""


#: A bytes value at least this large is written as it is, not copied into the payload.
_BY_REFERENCE_BYTES = 4096


def _bin_header(size: int) -> bytes:
    """msgpack's header of a bin of ``size`` bytes (``size`` >= 256: bin 16 or bin 32)."""
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


def _entry_parts(entry: dict[str, Any]) -> list[bytes]:
    """The entry's frame (header, then the payload in pieces): the payload is exactly
    ``msgpack.packb(entry, use_bin_type=True)``, but a large bytes value (the batch's body)
    is a piece of its own, written as received instead of copied twice (into the payload,
    then behind the header)."""
    packer = msgpack.Packer(use_bin_type=True)
    pieces: list[bytes] = [packer.pack_map_header(len(entry))]
    small: list[bytes] = []
    for key, value in entry.items():
        small.append(packer.pack(key))
        if isinstance(value, bytes) and len(value) >= _BY_REFERENCE_BYTES:
            small.append(_bin_header(len(value)))
            pieces.append(b"".join(small))
            pieces.append(value)
            small = []
        else:
            small.append(packer.pack(value))
    pieces.append(b"".join(small))
    crc = 0
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
    return [_HEADER.pack(sum(map(len, pieces)), crc), *pieces]


def encode_entry(entry: dict[str, Any]) -> bytes:
    return b"".join(_entry_parts(entry))


def decode_entry(payload: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = msgpack.unpackb(payload, raw=False)
    return entry


class WalSegment:
    """One segment file: its number, path, and the latest finish minute of its records
    (what decides when a checkpoint covers it whole)."""

    __slots__ = ("k", "max_finish_minute", "path")

    def __init__(self, k: int, path: Path, max_finish_minute: int = -1) -> None:
        self.k = k
        self.path = path
        self.max_finish_minute = max_finish_minute

    def entries(self) -> Iterator[bytes]:
        """The payloads of the segment's complete entries, in order (a torn tail ends it).
        Streamed: one entry in memory at a time."""
        position = 0
        with self.path.open("rb") as file:
            while len(header := file.read(_HEADER.size)) == _HEADER.size:
                length, crc = _HEADER.unpack(header)
                payload = file.read(length) if length <= MAX_ENTRY_BYTES else b""
                if len(payload) != length or zlib.crc32(payload) != crc:
                    logger.warning(
                        "write-ahead log %s: torn or corrupt entry at byte %d (an "
                        "unacknowledged write cut by a crash); the replay of this segment "
                        "stops there",
                        self.path.name,
                        position,
                    )
                    return
                yield payload
                position += _HEADER.size + length


class WriteAheadLog:
    """The log in ``directory`` (created if needed) for ``epoch``; ``fsync=False`` skips
    the syncs (tests, or a deployment that accepts losing the last acknowledged batches)."""

    def __init__(self, directory: Path, epoch: str, *, fsync: bool = True) -> None:
        self.directory = directory
        self.epoch = epoch
        self.fsync = fsync
        directory.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(directory / "LOCK", "a+b")  # noqa: SIM115 (held for life)
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise WalError(
                f"write-ahead log folder {directory} is in use by another process; "
                "give each control plane its own (setting wal_dir)"
            ) from None
        self.sealed: list[WalSegment] = []
        for path in sorted(directory.iterdir()):
            match = _NAME.match(path.name)
            if match is None:
                continue
            if match["epoch"] != epoch:
                logger.warning("write-ahead log: deleting %s of another epoch", path.name)
                path.unlink()
                continue
            self.sealed.append(WalSegment(int(match["k"]), path))
        self.failed: str | None = None
        self._append_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._written = 0  # bytes appended to the current segment
        self._synced = 0
        self._generation = 0  # bumps at each rotation: offsets are per generation
        self.num_syncs = 0
        self.num_bytes = 0
        next_k = self.sealed[-1].k + 1 if self.sealed else 0
        self.current = WalSegment(next_k, self._path(next_k))
        self._fd = os.open(self.current.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._sync_dir()

    def _path(self, k: int) -> Path:
        return self.directory / f"{self.epoch}-{k:012d}.wal"

    def _sync_dir(self) -> None:
        if self.fsync:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _fail(self, exc: BaseException) -> WalError:
        self.failed = f"{type(exc).__name__}: {exc}"
        logger.error("write-ahead log failed (%s): nothing more is acknowledged", self.failed)
        return WalError(f"the write-ahead log failed ({self.failed}); restart the control plane")

    def append(self, entry: dict[str, Any], max_finish_minute: int) -> tuple[int, int]:
        """Write one entry (call under the ingest lock, so entries keep the apply order);
        returns the position :meth:`sync` waits for."""
        if self.failed is not None:
            raise WalError(f"the write-ahead log failed ({self.failed}); restart the control plane")
        parts = _entry_parts(entry)
        size = sum(map(len, parts))
        with self._append_lock:
            try:
                written = os.writev(self._fd, parts)
                if written < size:  # a short write (rare): the rest from where it stopped
                    view = memoryview(b"".join(parts))[written:]
                    while view:
                        view = view[os.write(self._fd, view) :]
            except OSError as exc:
                raise self._fail(exc) from None
            self._written += size
            self.num_bytes += size
            self.current.max_finish_minute = max(self.current.max_finish_minute, max_finish_minute)
            return self._generation, self._written

    def sync(self, position: tuple[int, int]) -> None:
        """Return once the entry at ``position`` is on disk (group commit: one ``fsync``
        covers every entry written before it started)."""
        if not self.fsync:
            return
        generation, offset = position
        with self._sync_lock:
            if self.failed is not None:
                raise WalError(
                    f"the write-ahead log failed ({self.failed}); restart the control plane"
                )
            if generation != self._generation or self._synced >= offset:
                return  # a rotation (which syncs) or an earlier fsync covered it
            with self._append_lock:
                target, fd = self._written, self._fd
            try:
                os.fdatasync(fd)
            except OSError as exc:
                raise self._fail(exc) from None
            self._synced = target
            self.num_syncs += 1

    def rotate(self) -> int:
        """Seal the current segment and open the next (call under the ingest lock).
        Returns the number of the sealed segment."""
        with self._sync_lock, self._append_lock:
            if self.fsync:
                os.fdatasync(self._fd)
            os.close(self._fd)
            sealed = self.current
            self.sealed.append(sealed)
            self.current = WalSegment(sealed.k + 1, self._path(sealed.k + 1))
            self._fd = os.open(self.current.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._generation += 1
            self._written = self._synced = 0
        self._sync_dir()
        return sealed.k

    def release(self, through_k: int, covered_until_minute: int) -> int:
        """Delete sealed segments up to ``through_k`` whose every record finishes before
        ``covered_until_minute`` (a checkpoint in the database covers them whole).
        Returns how many were deleted."""
        keep, deleted = [], 0
        for segment in self.sealed:
            if segment.k <= through_k and segment.max_finish_minute < covered_until_minute:
                segment.path.unlink(missing_ok=True)
                deleted += 1
            else:
                keep.append(segment)
        self.sealed = keep
        return deleted

    @property
    def segments(self) -> list[WalSegment]:
        return [*self.sealed, self.current]

    def close(self) -> None:
        with self._sync_lock, self._append_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        self._lock_file.close()
