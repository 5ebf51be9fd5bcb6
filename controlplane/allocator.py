"""glibc's allocator, set by the control plane itself at start-up: its mmap threshold fixed,
and the heap trimmed on a timer.

With glibc's default (a *dynamic* mmap threshold, which rises after the first large
``free``), the goodput engine's multi-MB numpy arrays (the dry-run store's chunks, each
ingest batch's temporaries) end up on the heap and fragment it: in a 10-min soak the
control plane's RSS grew 18 % after every bounded store was full (docs/goodput-engine.md,
*Soak*). A threshold fixed low (128 KiB) bounds RSS, but then every emission-sized array
of an ingest batch is a fresh ``mmap``, page-faulted in and unmapped when freed (in
process 15.3 ms of CPU and 2,180 page faults per 512-record batch, against 9.3 ms and 4
with the settings below: docs/ingest.md); a threshold fixed higher without more (4 or
16 MiB) brings the fragmentation back (+11 to +15 % in short soaks).

So :func:`fix_mmap_threshold`, called by ``serve`` before the app is built, sets
``mallopt(M_MMAP_THRESHOLD, n)`` (the setting's default: 32 MiB, glibc's largest; it
also turns the dynamic adjustment off, as the environment variable
``MALLOC_MMAP_THRESHOLD_`` does) and the trim threshold at twice it, as the dynamic
adjustment would (``mallopt(M_TRIM_THRESHOLD, ...)``): a batch's temporaries come from
the heap and its top is kept for the next batch instead of being returned and faulted in
again. :func:`start_trimming` then calls ``malloc_trim(0)`` every
``malloc_trim_interval_s`` (5 s) in a daemon thread: the free pages inside the heap, which
the trim threshold never returns, go back to the system, and RSS stays bounded: in a
150-s soak it grew 8.5 % after the warm-up (4.9 % at 128 KiB without the timer), and stood
70 MB higher than at 128 KiB (42 MB in the 10-min soak, whose RSS did not grow): an
arena's free top is kept up to the trim threshold (docs/goodput-engine.md, *Soak*).

It does nothing (and says why in its result) when the C library is not glibc (no
``mallopt``: musl, macOS, Windows), when the operator already chose a threshold
(``MALLOC_MMAP_THRESHOLD_`` or the ``glibc.malloc.mmap_threshold`` tunable in
``GLIBC_TUNABLES``: theirs is kept, and so is a trim threshold set the same ways), or when
the setting is 0 (``GOODPUT_MALLOC_MMAP_THRESHOLD=0``: glibc's default). The timer is
independent of it (``GOODPUT_MALLOC_TRIM_INTERVAL_S=0``: off).

Example::

    applied = fix_mmap_threshold(settings.malloc_mmap_threshold, os.environ)
    stop = start_trimming(settings.malloc_trim_interval_s)
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Mapping

__all__ = [
    "DEFAULT_TRIM_THRESHOLD",
    "ENV_VAR",
    "MAX_MMAP_THRESHOLD",
    "M_MMAP_THRESHOLD",
    "M_TRIM_THRESHOLD",
    "fix_mmap_threshold",
    "start_trimming",
    "trim_threshold_for",
]

log = logging.getLogger(__name__)

# glibc's malloc.h: #define M_TRIM_THRESHOLD -1, #define M_MMAP_THRESHOLD -3
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's DEFAULT_TRIM_THRESHOLD (malloc.c): the least trim threshold set here.
DEFAULT_TRIM_THRESHOLD = 128 * 1024
# The setting's upper bound: glibc's largest dynamic threshold on 64-bit builds, above
# which older glibc releases refuse the value (HEAP_MAX_SIZE / 2; 2.36 accepts it).
MAX_MMAP_THRESHOLD = 32 * 2**20
ENV_VAR = "MALLOC_MMAP_THRESHOLD_"
TUNABLE = "glibc.malloc.mmap_threshold"
TRIM_ENV_VAR = "MALLOC_TRIM_THRESHOLD_"
TRIM_TUNABLE = "glibc.malloc.trim_threshold"


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt`` from the running process, ``None`` where there is none."""
    try:
        libc = ctypes.CDLL(None)
    except (OSError, TypeError):  # Windows: no handle for the process itself
        return None
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    result: Callable[[int, int], int] = mallopt
    return result


def fix_mmap_threshold(threshold: int, environ: Mapping[str, str]) -> bool:
    """Set glibc's mmap threshold to ``threshold`` bytes (and its trim threshold to
    :func:`trim_threshold_for` it, unless the operator set that); ``True`` when the mmap
    threshold was applied.

    ``False`` (and a log line saying why) when ``threshold`` is 0, when
    ``environ`` already fixes the threshold (the operator's value stands), when there is
    no ``mallopt`` (not glibc), or when glibc refuses the value.
    """
    if threshold <= 0:
        log.debug("malloc mmap threshold left to the C library (setting is 0)")
        return False
    if ENV_VAR in environ or TUNABLE in environ.get("GLIBC_TUNABLES", ""):
        log.info("malloc mmap threshold: keeping the one set in the environment")
        return False
    mallopt = _mallopt()
    if mallopt is None:
        log.debug("malloc mmap threshold: no mallopt in this C library, left as it is")
        return False
    if not mallopt(M_MMAP_THRESHOLD, threshold):
        log.warning("malloc mmap threshold: mallopt refused %d bytes", threshold)
        return False
    trim = TRIM_ENV_VAR not in environ and TRIM_TUNABLE not in environ.get("GLIBC_TUNABLES", "")
    trim_threshold = trim_threshold_for(threshold)
    if trim and not mallopt(M_TRIM_THRESHOLD, trim_threshold):
        log.warning("malloc trim threshold: mallopt refused %d bytes", trim_threshold)
    log.info(
        "malloc mmap threshold fixed at %d bytes%s",
        threshold,
        f", trim threshold at {trim_threshold}" if trim else "",
    )
    return True


def trim_threshold_for(threshold: int) -> int:
    """The trim threshold that goes with an mmap threshold: twice it, as glibc's dynamic
    adjustment sets it (at least glibc's default, 128 KiB)."""
    return max(DEFAULT_TRIM_THRESHOLD, 2 * threshold)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` from the running process, ``None`` where there is none."""
    try:
        libc = ctypes.CDLL(None)
    except (OSError, TypeError):
        return None
    malloc_trim = getattr(libc, "malloc_trim", None)
    if malloc_trim is None:
        return None
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    result: Callable[[int], int] = malloc_trim
    return result


def start_trimming(interval_s: float) -> threading.Event | None:
    """Call ``malloc_trim(0)`` every ``interval_s`` seconds in a daemon thread: the free
    pages inside the heap go back to the system. Returns the event that stops it, ``None``
    when ``interval_s`` is 0 or there is no ``malloc_trim`` (not glibc)."""
    if interval_s <= 0:
        return None
    malloc_trim = _malloc_trim()
    if malloc_trim is None:
        log.debug("malloc trim: no malloc_trim in this C library")
        return None
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(interval_s):
            malloc_trim(0)  # ctypes releases the GIL for the call

    threading.Thread(target=run, name="malloc-trim", daemon=True).start()
    log.info("malloc_trim every %g s", interval_s)
    return stop
