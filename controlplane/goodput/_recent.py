"""The dry-run store: recent final requests as columns, to judge candidate objectives.

Each row keeps what a verdict needs without the token times: finish time, vantage,
status, label codes (one engine-wide dictionary per label key), TTFT, TPOT, E2EL, the
largest ITL gap, a few per-request ITL percentiles, the output tokens and whether the
record carried its ITL — 103 bytes with the default four percentiles. Rows live in
fixed-size chunks; the oldest chunk goes when the store holds more than ``cap_rows`` rows
(counted as evicted) or when all its rows are older than ``retention_s`` (expired, not
counted).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controlplane.goodput import _summarize as col
from controlplane.goodput._batch import E2EL, METRICS, TPOT, TTFT, BatchView
from controlplane.goodput._judge import judge_values, status_batch
from controlplane.goodput.spec import SLOSpec
from exporters.latency import RequestLatencies
from exporters.records import LABEL_KEYS, Status
from exporters.sketch import LatencySketch

__all__ = ["RecentStore"]

B = npt.NDArray[np.bool_]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
U32 = npt.NDArray[np.uint32]

# Float columns of a chunk, after which come the ITL percentiles.
_TTFT, _TPOT, _E2EL, _ITL_MAX, _FINISH = range(5)
_NUM_FLOATS = 5


@dataclass(slots=True)
class _Chunk:
    floats: F64  # (_NUM_FLOATS + num percentiles, capacity)
    codes: U32  # (len(LABEL_KEYS), capacity)
    vantage: npt.NDArray[np.uint8]
    status: npt.NDArray[np.uint8]
    tokens: I64
    itl_measured: B
    size: int = 0
    newest_s: float = -np.inf

    @classmethod
    def empty(cls, capacity: int, num_percentiles: int) -> _Chunk:
        return cls(
            floats=np.empty((_NUM_FLOATS + num_percentiles, capacity)),
            codes=np.empty((len(LABEL_KEYS), capacity), dtype=np.uint32),
            vantage=np.empty(capacity, dtype=np.uint8),
            status=np.empty(capacity, dtype=np.uint8),
            tokens=np.empty(capacity, dtype=np.int64),
            itl_measured=np.empty(capacity, dtype=np.bool_),
        )

    @property
    def capacity(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(
            a.nbytes
            for a in (
                self.floats,
                self.codes,
                self.vantage,
                self.status,
                self.tokens,
                self.itl_measured,
            )
        )


class RecentStore:
    """Bounded columnar store of recent final requests (see the module docstring)."""

    def __init__(
        self, cap_rows: int, itl_percentiles: tuple[float, ...], retention_s: float = 3600.0
    ) -> None:
        if cap_rows < 1:
            raise ValueError(f"recent_rows_cap must be >= 1, got {cap_rows}")
        self.cap_rows = cap_rows
        self.itl_percentiles = itl_percentiles
        self.retention_s = retention_s
        self.chunk_rows = max(256, min(65536, cap_rows // 8))
        self.chunks: deque[_Chunk] = deque()
        self.rows = 0
        self.evicted = 0
        # Rows finishing up to this time may be missing (evicted to respect the cap).
        self.evicted_through_s = -np.inf
        self._codes: list[dict[str, int]] = [{} for _ in LABEL_KEYS]

    def append(self, view: BatchView) -> None:
        """Keep the batch's accepted final rows that finish within the retention."""
        rows = np.flatnonzero(view.accepted & (view.sec > view.now_s - self.retention_s))
        if rows.shape[0] == 0:
            return
        lat = view.latencies
        floats = [lat.ttft_s, lat.tpot_s, lat.e2el_s, lat.itl_max_s, view.finish_s]
        floats += [view.itl_percentiles[q] for q in self.itl_percentiles]
        values = np.stack([f[rows] for f in floats])
        codes = np.stack(
            [self._global_codes(k, key, view, rows) for k, key in enumerate(LABEL_KEYS)]
        )
        vantage, status = view.vantage[rows], view.status[rows]
        tokens = view.tokens[rows]
        itl_measured = lat.itl_measured[rows]
        done = 0
        while done < rows.shape[0]:
            if not self.chunks or self.chunks[-1].size == self.chunks[-1].capacity:
                self.chunks.append(_Chunk.empty(self.chunk_rows, len(self.itl_percentiles)))
            chunk = self.chunks[-1]
            take = min(chunk.capacity - chunk.size, rows.shape[0] - done)
            dst, src = slice(chunk.size, chunk.size + take), slice(done, done + take)
            chunk.floats[:, dst] = values[:, src]
            chunk.codes[:, dst] = codes[:, src]
            chunk.vantage[dst], chunk.status[dst] = vantage[src], status[src]
            chunk.tokens[dst] = tokens[src]
            chunk.itl_measured[dst] = itl_measured[src]
            chunk.newest_s = max(chunk.newest_s, float(values[_FINISH, src].max()))
            chunk.size += take
            done += take
        self.rows += rows.shape[0]
        while self.rows > self.cap_rows and len(self.chunks) > 1:
            oldest = self.chunks.popleft()
            self.rows -= oldest.size
            self.evicted += oldest.size
            self.evicted_through_s = max(self.evicted_through_s, oldest.newest_s)

    def expire(self, now: float) -> None:
        """Forget chunks whose rows all finished before the retention."""
        while len(self.chunks) > 1 and self.chunks[0].newest_s <= now - self.retention_s:
            self.rows -= self.chunks.popleft().size

    def _global_codes(self, k: int, key: str, view: BatchView, rows: I64) -> U32:
        column = view.labels[key]
        dictionary = self._codes[k]
        mapping = np.array(
            [dictionary.setdefault(v, len(dictionary)) for v in column.values], dtype=np.uint32
        )
        codes: U32 = mapping[column.codes[rows]] if mapping.shape[0] else column.codes[rows]
        return codes

    def evaluate(self, spec: SLOSpec, window_s: float, now: float) -> tuple[I64, I64]:
        """Counter sums (``spec``'s columns) and sketches of the rows ``spec`` selects that
        finished in ``(now − window_s, now]``, judged with ``spec``'s objectives."""
        width = col.width(len(spec.objectives))
        counts = np.zeros(width, dtype=np.int64)
        sketches = np.zeros((len(METRICS), LatencySketch.NUM_BUCKETS), dtype=np.int64)
        wanted: list[tuple[int, int]] = []
        for key, value in spec.selector.items():
            k = LABEL_KEYS.index(key)
            code = self._codes[k].get(value)
            if code is None:
                return counts, sketches
            wanted.append((k, code))
        percentiles = {q: _NUM_FLOATS + i for i, q in enumerate(self.itl_percentiles)}
        for chunk in self.chunks:
            n = chunk.size
            finish = chunk.floats[_FINISH, :n]
            mask = (finish > now - window_s) & (finish <= now) & (chunk.vantage[:n] == spec.vantage)
            for k, code in wanted:
                mask &= chunk.codes[k, :n] == code
            rows = np.flatnonzero(mask)
            if rows.shape[0]:
                self._judge_rows(spec, chunk, rows, percentiles, counts=counts, sketches=sketches)
        return counts, sketches

    @staticmethod
    def _judge_rows(
        spec: SLOSpec,
        chunk: _Chunk,
        rows: I64,
        percentiles: dict[float, int],
        *,
        counts: I64,
        sketches: I64,
    ) -> None:
        f = chunk.floats[:, rows]
        status = chunk.status[rows]
        tokens = chunk.tokens[rows]
        latencies = RequestLatencies(
            ttft_s=f[_TTFT],
            tpot_s=f[_TPOT],
            e2el_s=f[_E2EL],
            itl_max_s=f[_ITL_MAX],
            output_tokens=tokens,
            num_gaps=np.zeros(rows.shape[0], dtype=np.int64),
            itl_measured=chunk.itl_measured[rows],
        )
        batch = status_batch(status, np.ones(rows.shape[0], dtype=np.bool_))
        itl = {q: f[i] for q, i in percentiles.items()}
        verdicts = judge_values(batch, latencies, itl, spec.objectives)
        judged, good = verdicts.judged, verdicts.good
        aborted = status == Status.ABORTED
        counts[col.REQUESTS] += np.count_nonzero(judged)
        counts[col.GOOD] += np.count_nonzero(good)
        counts[col.ERRORS] += np.count_nonzero(status == Status.ERROR)
        counts[col.ABORTED] += np.count_nonzero(aborted)
        counts[col.REJECTED] += np.count_nonzero(status == Status.REJECTED)
        counts[col.OUTPUT_TOKENS] += int(tokens[judged | aborted].sum())
        counts[col.GOOD_OUTPUT_TOKENS] += int(tokens[good].sum())
        k = len(spec.objectives)
        counts[col.BASE_COLUMNS : col.BASE_COLUMNS + k] += (
            judged[:, None] & verdicts.violated
        ).sum(axis=0)
        counts[col.BASE_COLUMNS + k :] += (judged[:, None] & ~verdicts.measured).sum(axis=0)
        ok = status == Status.OK
        for metric, row in ((TTFT, _TTFT), (TPOT, _TPOT), (E2EL, _E2EL)):
            sketches[metric] += LatencySketch.bucket_counts(f[row][ok])

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)
