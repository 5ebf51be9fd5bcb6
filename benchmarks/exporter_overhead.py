"""Per-token cost of ``RequestTrace.token()`` against a bare ``lst.append(time.perf_counter_ns())``.

Usage: ``python benchmarks/exporter_overhead.py [--quick]``

Both loops run in the same process, interleaved round by round (so drift in CPU frequency
or load on a shared machine hits both alike), and each reports the median over rounds of
nanoseconds per token. The trace's buffer is sized for the round (``expected_tokens``), so
what is measured is the steady-state hot path; growth is rare and measured apart, as is
the per-token share of ``finish()`` (the numpy conversion, once per request).

The same rounds also time the hot-path designs the recorder could have used, each written
as the same one-method trace object: item assignment into a ``memoryview`` cast to
``'q'`` (the one kept), into an ``array('q')``, into a numpy array and into a preallocated
list (keeps an int object per token); ``list.append`` (likewise); and a frame-free C
iterator chain (see :class:`MapAppendTrace`). The last printed
line is one JSON object: ``{"ns_per_token": ..., "baseline_ns_per_token": ..., "ratio": ...}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporters.recorder import RequestRecorder
from exporters.records import RequestRecord, Vantage


class NullSink:
    def export(self, record: RequestRecord) -> None:
        pass

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        pass


class ArrayTrace:
    """``array('q')`` item assignment (its setitem parses the int with ``PyArg_Parse``)."""

    __slots__ = ("_buf", "_clock", "_n")

    def __init__(self, n: int) -> None:
        self._buf = array("q", bytes(8 * n))
        self._n = 0
        self._clock = time.perf_counter_ns

    def token(self) -> None:
        ts = self._clock()
        try:
            self._buf[self._n] = ts
        except IndexError:
            raise
        self._n += 1


class MemoryviewTrace(ArrayTrace):
    """The recorder's design, reduced to the hot path: a ``memoryview`` cast to ``'q'``."""

    __slots__ = ()

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self._buf = memoryview(bytearray(8 * n)).cast("q")  # type: ignore[assignment]


class NumpyTrace(ArrayTrace):
    """numpy element assignment into a preallocated int64 array."""

    __slots__ = ()

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self._buf = np.zeros(n, dtype=np.int64)  # type: ignore[assignment]


class ListTrace(ArrayTrace):
    """Item assignment into a preallocated list (keeps one int object per token)."""

    __slots__ = ()

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self._buf = [0] * n  # type: ignore[assignment]


class AppendTrace:
    """``list.append`` (no index, but the list reallocates as it grows and keeps objects)."""

    __slots__ = ("_buf", "_clock")

    def __init__(self, n: int) -> None:
        self._buf: list[int] = []
        self._clock = time.perf_counter_ns

    def token(self) -> None:
        self._buf.append(self._clock())


class MapAppendTrace:
    """No Python frame at all: ``token`` is the ``__next__`` of a C iterator chain that
    reads the clock and appends to an ``array('q')``. Measured for reference; the recorder
    does not use it because the array then reallocates in ~6 % steps as it grows and cannot
    be preallocated or recycled, and a sealed trace could not refuse late tokens.
    """

    __slots__ = ("_buf", "token")

    def __init__(self, n: int) -> None:
        self._buf = array("q")
        self.token = map(self._buf.append, iter(time.perf_counter_ns, None)).__next__


def time_baseline(n: int) -> float:
    lst: list[int] = []
    start = time.perf_counter_ns()
    for _ in range(n):
        lst.append(time.perf_counter_ns())
    return (time.perf_counter_ns() - start) / n


def time_trace(recorder: RequestRecorder, n: int) -> tuple[float, float]:
    """ns per token of ``token()``, and of ``finish()`` spread over the tokens."""
    trace = recorder.start("bench", expected_tokens=n)
    start = time.perf_counter_ns()
    for _ in range(n):
        trace.token()
    hot = (time.perf_counter_ns() - start) / n
    start = time.perf_counter_ns()
    trace.finish()
    return hot, (time.perf_counter_ns() - start) / n


def time_growing(recorder: RequestRecorder, n: int) -> float:
    """ns per token when the buffer starts at the default capacity and doubles."""
    trace = recorder.start("bench-grow")
    start = time.perf_counter_ns()
    for _ in range(n):
        trace.token()
    elapsed = (time.perf_counter_ns() - start) / n
    trace.finish()
    return elapsed


def time_design(make: Callable[[int], Any], n: int) -> float:
    trace = make(n)
    start = time.perf_counter_ns()
    for _ in range(n):
        trace.token()
    return (time.perf_counter_ns() - start) / n


def measured(fn: Callable[[], Any]) -> Any:
    gc.collect()
    gc.disable()  # a collection landing in one loop and not the other is noise
    try:
        return fn()
    finally:
        gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    args = parser.parse_args()
    rounds, n = (5, 200_000) if args.quick else (15, 300_000)

    recorder = RequestRecorder(Vantage.GATEWAY, NullSink())
    designs: dict[str, Callable[[int], Any]] = {
        "memoryview_q_setitem": MemoryviewTrace,
        "array_q_setitem": ArrayTrace,
        "numpy_setitem": NumpyTrace,
        "list_prealloc_setitem": ListTrace,
        "list_append": AppendTrace,
        "map_array_append_no_frame": MapAppendTrace,
    }
    samples: dict[str, list[float]] = {
        k: [] for k in ("token", "baseline", "finish", "growing", *designs)
    }
    time_trace(recorder, 10_000)  # warm up (and specialise) both paths
    time_baseline(10_000)
    for _ in range(rounds):
        hot, finish = measured(lambda: time_trace(recorder, n))
        samples["token"].append(hot)
        samples["finish"].append(finish)
        samples["baseline"].append(measured(lambda: time_baseline(n)))
        samples["growing"].append(measured(lambda: time_growing(recorder, n)))
        for name, make in designs.items():
            samples[name].append(measured(lambda make=make: time_design(make, n)))

    median = {k: statistics.median(v) for k, v in samples.items()}
    print(
        f"rounds={rounds} tokens/round={n} python={sys.version.split()[0]}  "
        f"token() {median['token']:.1f} ns, baseline {median['baseline']:.1f} ns, "
        f"finish() {median['finish']:.1f} ns/token, growing buffer {median['growing']:.1f} ns"
    )
    print(json.dumps({"hot_path_designs_ns_per_token": {k: round(median[k], 1) for k in designs}}))
    print(
        json.dumps(
            {
                "ns_per_token": round(median["token"], 1),
                "baseline_ns_per_token": round(median["baseline"], 1),
                "ratio": round(median["token"] / median["baseline"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
