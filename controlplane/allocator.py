"""glibc's mmap threshold, fixed by the control plane itself at start-up.

With glibc's default (a *dynamic* mmap threshold, which rises after the first large
``free``), the goodput engine's multi-MB numpy arrays (the dry-run store's chunks, each
ingest batch's temporaries) end up on the heap and fragment it: in a 10-min soak the
control plane's RSS grew 18 % after every bounded store was full, 3 % with the threshold
fixed at 128 KiB (docs/goodput-engine.md, *Soak*). The image sets
``MALLOC_MMAP_THRESHOLD_`` for that; a control plane started any other way
(``goodput controlplane serve`` from a virtualenv) gets the same from
:func:`fix_mmap_threshold`, called by ``serve`` before the app is built.

It calls ``mallopt(M_MMAP_THRESHOLD, n)``, which also turns the dynamic adjustment off,
exactly as the environment variable does. Unlike the variable it comes after the
interpreter's start and the imports, by when the dynamic adjustment may already have raised
the threshold, and with it the heap's trim threshold (to twice the mmap threshold, up to
64 MiB: freed memory at the top of the heap is then kept, not returned). So it also puts
the trim threshold back to glibc's default, 128 KiB (``mallopt(M_TRIM_THRESHOLD, ...)``),
where it stays when the variable is set from the start, unless the operator set that one
(``MALLOC_TRIM_THRESHOLD_`` or ``glibc.malloc.trim_threshold``). In short soaks (150 s, a
store cap of 200 k rows, docs/goodput-engine.md, *Soak*) RSS after warm-up grew +9.0 % with
the mmap threshold alone (one run), +8.1 % and +4.6 % with the trim threshold too, and
+5.3 % and +7.1 % with the variable.

It does nothing (and says why in its result) when the C library is not glibc (no
``mallopt``: musl, macOS, Windows), when the operator already chose a threshold
(``MALLOC_MMAP_THRESHOLD_`` or the ``glibc.malloc.mmap_threshold`` tunable in
``GLIBC_TUNABLES``: theirs is kept), or when the setting is 0
(``GOODPUT_MALLOC_MMAP_THRESHOLD=0``: glibc's default).

Example::

    applied = fix_mmap_threshold(settings.malloc_mmap_threshold, os.environ)
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Mapping

__all__ = [
    "DEFAULT_TRIM_THRESHOLD",
    "ENV_VAR",
    "MAX_MMAP_THRESHOLD",
    "M_MMAP_THRESHOLD",
    "M_TRIM_THRESHOLD",
    "fix_mmap_threshold",
]

log = logging.getLogger(__name__)

# glibc's malloc.h: #define M_TRIM_THRESHOLD -1, #define M_MMAP_THRESHOLD -3
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc's DEFAULT_TRIM_THRESHOLD (malloc.c), the trim threshold it keeps with a fixed
# mmap threshold.
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
    """Set glibc's mmap threshold to ``threshold`` bytes (and its trim threshold to its
    default, unless the operator set it); ``True`` when the mmap threshold was applied.

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
    if trim and not mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD):
        log.warning("malloc trim threshold: mallopt refused %d bytes", DEFAULT_TRIM_THRESHOLD)
    log.info(
        "malloc mmap threshold fixed at %d bytes%s",
        threshold,
        f", trim threshold at {DEFAULT_TRIM_THRESHOLD}" if trim else "",
    )
    return True
