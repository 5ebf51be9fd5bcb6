"""Judge requests from stored per-request values, reusing :func:`exporters.slo.judge`.

The metric core judges a :class:`~exporters.records.RecordBatch`, computing ITL
percentiles from its token times. The engine has those percentiles already (computed once
per batch for every SLO, or kept per row in the dry-run store without the token times), so
:func:`judge_values` feeds them to the same ``judge``: each group of ITL-percentile
objectives with one percentile is judged as an ITL ``"max"`` objective over a copy of the
latencies whose ``itl_max_s`` is that percentile. The comparison rules (inclusive
thresholds, undefined is met, unmeasured is neither, who is judged and good) stay in one
place, the metric core. Whether ITL was measured travels in the latencies
(``RequestLatencies.itl_measured``), so the engine needs no token detail here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from controlplane.goodput.spec import SpecError
from exporters.latency import RequestLatencies
from exporters.records import NUM_PHASES, LabelColumn, RecordBatch
from exporters.slo import Metric, Objective, Verdicts, judge

__all__ = ["judge_values", "status_batch"]

B = npt.NDArray[np.bool_]
F64 = npt.NDArray[np.float64]
U8 = npt.NDArray[np.uint8]


def status_batch(status: U8, final: B) -> RecordBatch:
    """A batch with only the columns ``judge`` reads when it is given the latencies."""
    n = int(status.shape[0])
    empty_i64 = np.zeros(0, dtype=np.int64)
    return RecordBatch(
        request_ids=[""] * n,
        vantage=np.zeros(n, dtype=np.uint8),
        arrival_time_ns=np.zeros(n, dtype=np.int64),
        labels={},
        status=status,
        reason=LabelColumn([""], np.zeros(n, dtype=np.uint32)),
        final=final,
        token_detail=np.zeros(n, dtype=np.uint8),
        phase_offsets_us=np.zeros((n, NUM_PHASES), dtype=np.int64),
        kv_bytes=np.zeros(n, dtype=np.int64),
        prompt_tokens=np.zeros(n, dtype=np.int32),
        cached_tokens=np.zeros(n, dtype=np.int32),
        emission_starts=np.zeros(n + 1, dtype=np.int64),
        emission_offsets_us=empty_i64,
        emission_tokens=np.zeros(0, dtype=np.int32),
    )


def judge_values(
    batch: RecordBatch,
    latencies: RequestLatencies,
    itl_percentiles: Mapping[float, F64],
    objectives: Sequence[Objective],
) -> Verdicts:
    """Verdicts as ``judge(batch, objectives, latencies)`` gives them, ITL percentiles read
    from ``itl_percentiles`` (percentile → per-row values) instead of the token times.

    ``batch`` supplies ``status`` and ``final`` (see :func:`status_batch` when only those
    are known). Raises :class:`SpecError` naming the percentile when an objective needs one
    that ``itl_percentiles`` lacks.
    """
    plain: list[int] = []
    by_percentile: dict[float, list[int]] = {}
    for k, objective in enumerate(objectives):
        percentile = objective.percentile
        if percentile is None:
            plain.append(k)
        else:
            by_percentile.setdefault(percentile, []).append(k)
    base = judge(batch, [objectives[k] for k in plain], latencies)
    if not by_percentile:
        return base
    met = np.empty((len(batch), len(objectives)), dtype=np.bool_)
    measured = np.empty((len(batch), len(objectives)), dtype=np.bool_)
    met[:, plain] = base.met
    measured[:, plain] = base.measured
    good = base.good.copy()
    for percentile, indices in by_percentile.items():
        if percentile not in itl_percentiles:
            allowed = ["max", *(f"p{p:g}" for p in sorted(itl_percentiles))]
            raise SpecError(
                f"objectives: itl statistic 'p{percentile:g}' cannot be judged here; "
                f"allowed: {allowed}"
            )
        as_max = dataclasses.replace(latencies, itl_max_s=itl_percentiles[percentile])
        group = [Objective(Metric.ITL, objectives[k].threshold_s) for k in indices]
        verdicts = judge(batch, group, as_max)
        met[:, indices] = verdicts.met
        measured[:, indices] = verdicts.measured
        # good = judged ∧ OK ∧ no measured objective violated: the conjunction over groups.
        good &= verdicts.good
    return Verdicts(good=good, met=met, judged=base.judged, measured=measured)
