"""Finished simulated requests as request records, built column by column.

The simulator stands where the gateway stands, so its records are what the gateway would
measure: vantage ``GATEWAY``, every token (``FULL`` detail), labels ``model`` and ``route``
(``pd`` or ``colocated``). Times are virtual seconds since the simulation start plus
``epoch_s`` (a fixed wall-clock origin, so the goodput engine's windows and minutes line
up run after run). Phases: ``QUEUED`` when the request reached its first instance,
``PREFILL_START`` / ``PREFILL_END`` its first prefill's first and last iteration,
``KV_HANDOFF_START`` / ``KV_HANDOFF_END`` when its KV cache left the prefill instance and
landed on the decode one (PD only), ``FINISHED`` its last token. ``kv_bytes`` is the KV
moved between instances (PD only).

:class:`RecordBuilder` collects jobs and builds one :class:`~exporters.records.RecordBatch`
per flush straight from columns (one ``concatenate`` of the shared token-time arrays, one
vectorised conversion to µs offsets): per-request Python work, never per token.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from exporters.records import LABEL_KEYS, LabelColumn, RecordBatch, Status, TokenDetail, Vantage
from serving.sim.instance import Job

__all__ = ["RecordBuilder"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


class RecordBuilder:
    """Collects finished jobs and turns them into record batches (module docstring).

    Every ``itl_sample_every``-th request (in finish order) also gives its ITL gaps to
    :attr:`itl_samples`, and every request with a token its TTFT to :attr:`ttft_samples`,
    for plots (the report's numbers come from the goodput engine, not from these).
    """

    def __init__(
        self,
        *,
        epoch_s: float,
        model: str,
        route: str,
        request_id_prefix: str = "sim-",
        itl_sample_every: int = 16,
    ) -> None:
        self.epoch_ns = round(epoch_s * 1e9)
        self.labels = {"model": model, "route": route}
        self.prefix = request_id_prefix
        self.itl_sample_every = itl_sample_every
        self._jobs: list[Job] = []
        self._status: list[int] = []
        self._reasons: list[str] = []
        self._count = 0
        self.ttft_samples: list[F64] = []
        self.itl_samples: list[F64] = []

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, job: Job, status: Status = Status.OK, reason: str = "") -> None:
        """A request that ended: ``OK`` with its tokens, or ``REJECTED`` / ``ERROR``."""
        self._jobs.append(job)
        self._status.append(int(status))
        self._reasons.append(reason)

    def build(self) -> RecordBatch:
        """The collected jobs as one batch (then forgotten)."""
        jobs, status, reasons = self._jobs, self._status, self._reasons
        self._jobs, self._status, self._reasons = [], [], []
        n = len(jobs)
        arrival = np.fromiter((j.arrival_s for j in jobs), dtype=np.float64, count=n)
        counts = np.fromiter((j.generated for j in jobs), dtype=np.int64, count=n)
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        arrays = [a for j in jobs for a in j.emissions]
        if arrays:
            times = np.concatenate(arrays)  # a fresh array: safe to work in place
            times -= np.repeat(arrival, counts)
            times *= 1e6
            offsets: I64 = np.rint(times, out=times).astype(np.int64)
        else:
            offsets = np.zeros(0, dtype=np.int64)
        phases = np.array(
            [
                (j.queued_s, j.prefill_start_s, j.prefill_end_s, j.kv_start_s, j.kv_end_s)
                for j in jobs
            ],
            dtype=np.float64,
        ).reshape(n, 5)
        phases = np.column_stack((phases, [j.finished_s for j in jobs]))
        phases -= arrival[:, None]
        phases *= 1e6
        np.rint(phases, out=phases)
        phases[np.isnan(phases)] = -1.0
        phase_us = phases.astype(np.int64)
        self._sample(offsets, starts, counts)
        zeros = np.zeros(n, dtype=np.uint32)
        labels = {key: LabelColumn([self.labels.get(key, "")], zeros.copy()) for key in LABEL_KEYS}
        self._count += n
        return RecordBatch(
            request_ids=[f"{self.prefix}{j.index}" for j in jobs],
            vantage=np.full(n, Vantage.GATEWAY, dtype=np.uint8),
            arrival_time_ns=self.epoch_ns + np.rint(arrival * 1e9).astype(np.int64),
            labels=labels,
            status=np.array(status, dtype=np.uint8).reshape(n),
            reason=LabelColumn.encode(reasons),
            final=np.ones(n, dtype=np.bool_),
            token_detail=np.full(n, TokenDetail.FULL, dtype=np.uint8),
            phase_offsets_us=phase_us,
            kv_bytes=np.fromiter((j.kv_bytes for j in jobs), dtype=np.int64, count=n),
            prompt_tokens=np.fromiter((j.prompt_tokens for j in jobs), dtype=np.int32, count=n),
            cached_tokens=np.fromiter((j.cached_tokens for j in jobs), dtype=np.int32, count=n),
            emission_starts=starts,
            emission_offsets_us=offsets,
            emission_tokens=np.ones(offsets.shape[0], dtype=np.int32),
        )

    def _sample(self, offsets: I64, starts: I64, counts: I64) -> None:
        has_token = counts > 0
        if has_token.any():
            self.ttft_samples.append(offsets[starts[:-1][has_token]] / 1e6)
        every = self.itl_sample_every
        first = (-self._count) % every
        rows = np.arange(first, counts.shape[0], every)
        rows = rows[counts[rows] >= 2]
        if rows.shape[0]:
            gaps = [np.diff(offsets[starts[r] : starts[r + 1]]) for r in rows.tolist()]
            self.itl_samples.append(np.concatenate(gaps) / 1e6)
