"""Shared builders for the goodput engine tests: records with known finish times, specs,
a fake clock, and the offline exact computation the engine must agree with."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from controlplane.goodput import SLOSpec
from exporters.latency import itl_gaps_s, request_latencies
from exporters.records import (
    Labels,
    Phase,
    RecordBatch,
    RequestRecord,
    Status,
    TokenDetail,
    Vantage,
)
from exporters.slo import Metric, Objective, judge

# A UTC day boundary, so minute/hour/day slots line up with round offsets from it.
T0 = 1_699_920_000
NS = 1_000_000_000


class FakeClock:
    """An injected clock: wall-clock seconds, set by the test."""

    def __init__(self, now: float = T0) -> None:
        self.now = float(now)

    def __call__(self) -> float:
        return self.now


def make_record(
    rid: str,
    finish_us: int,
    *,
    ttft_us: int = 100_000,
    gaps_us: Sequence[int] = (20_000, 20_000),
    status: Status = Status.OK,
    labels: Labels | None = None,
    vantage: Vantage = Vantage.GATEWAY,
    final: bool = True,
    tokens: Sequence[int] | None = None,
    detail: TokenDetail = TokenDetail.FULL,
) -> RequestRecord:
    """A request finishing (last emission) at ``finish_us`` µs after the epoch.

    With ``ttft_us < 0`` the request has no emission and its FINISHED phase is 50 ms.
    """
    phases = np.full(6, -1, dtype=np.int64)
    if ttft_us < 0:
        offsets = np.zeros(0, dtype=np.int64)
        phases[Phase.FINISHED] = 50_000
        arrival_us = finish_us - 50_000
    else:
        offsets = ttft_us + np.concatenate(([0], np.cumsum(np.asarray(gaps_us, dtype=np.int64))))
        arrival_us = finish_us - int(offsets[-1])
    return RequestRecord(
        request_id=rid,
        vantage=vantage,
        arrival_time_ns=arrival_us * 1000,
        labels=labels or Labels(model="m"),
        emission_offsets_us=offsets.astype(np.int64),
        emission_tokens=None if tokens is None else np.asarray(tokens, dtype=np.int32),
        token_detail=detail,
        phase_offsets_us=phases,
        status=status,
        final=final,
    )


def make_spec(
    objectives: Iterable[Objective] = (Objective(Metric.TTFT, 0.2),),
    *,
    slo_id: str = "s1",
    target: float = 0.9,
    window_s: float = 28 * 86400,
    selector: dict[str, str] | None = None,
    vantage: Vantage = Vantage.GATEWAY,
) -> SLOSpec:
    return SLOSpec(
        id=slo_id,
        name=f"name-{slo_id}",
        objectives=tuple(objectives),
        target=target,
        window_s=window_s,
        selector=selector or {},
        vantage=vantage,
    )


def finish_ns(rec: RequestRecord) -> int:
    """The finish time the engine uses, ns: arrival + E2EL (or arrival when undefined)."""
    batch = RecordBatch.from_records([rec])
    e2el = request_latencies(batch).e2el_s[0]
    offset_ns = 0 if math.isnan(e2el) else round(e2el * 1e6) * 1000
    return rec.arrival_time_ns + offset_ns


def finish_second(rec: RequestRecord) -> int:
    return finish_ns(rec) // NS


def selects(spec: SLOSpec, rec: RequestRecord) -> bool:
    labels = rec.labels
    return rec.vantage == spec.vantage and all(
        getattr(labels, key) == value for key, value in spec.selector.items()
    )


@dataclass
class Offline:
    """Exact counts of a set of records against a spec, from the metric core directly."""

    requests: int
    good: int
    errors: int
    aborted: int
    rejected: int
    output_tokens: int
    good_output_tokens: int
    violations: dict[str, int]
    measured: dict[str, int]
    ttft: list[float]
    tpot: list[float]
    itl: list[float]
    e2el: list[float]


def offline(spec: SLOSpec, records: Sequence[RequestRecord]) -> Offline:
    """Judge ``records`` (already chosen by the caller) with ``judge`` over one batch."""
    chosen = [r for r in records if r.final and selects(spec, r)]
    batch = RecordBatch.from_records(chosen)
    verdicts = judge(batch, spec.objectives)
    lat = request_latencies(batch)
    status = batch.status
    ok = status == Status.OK
    aborted = status == Status.ABORTED
    tokens = batch.output_tokens()
    admitted = verdicts.judged | aborted
    gaps, gap_rows = itl_gaps_s(batch)
    return Offline(
        requests=verdicts.num_judged,
        good=verdicts.num_good,
        errors=int((status == Status.ERROR).sum()),
        aborted=int(aborted.sum()),
        rejected=int((status == Status.REJECTED).sum()),
        output_tokens=int(tokens[admitted].sum()),
        good_output_tokens=int(tokens[verdicts.good].sum()),
        violations={
            key: int((verdicts.judged & verdicts.violated[:, k]).sum())
            for k, key in enumerate(spec.objective_keys)
        },
        measured=dict(zip(spec.objective_keys, verdicts.num_measured, strict=True)),
        ttft=[float(v) for v in lat.ttft_s[ok] if not math.isnan(v)],
        tpot=[float(v) for v in lat.tpot_s[ok] if not math.isnan(v)],
        itl=[float(v) for v in gaps[ok[gap_rows]]] if gaps.shape[0] else [],
        e2el=[float(v) for v in lat.e2el_s[ok] if not math.isnan(v)],
    )


def exact_quantile(values: Sequence[float], q: float) -> float:
    """The sketch's reference quantile: the value of rank max(1, ceil(q·n)), ascending."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered) - 1e-9))
    return ordered[rank - 1]


def assert_close_quantile(estimate: float | None, values: Sequence[float], q: float) -> None:
    """``estimate`` within the sketch's stated relative error (1 %) of the exact quantile."""
    if not values:
        assert estimate is None
        return
    exact = exact_quantile(values, q)
    assert estimate is not None
    if exact < 1e-6:
        assert estimate == 0.0
    else:
        assert abs(estimate - exact) <= 0.01 * exact * (1 + 1e-9), (estimate, exact, q)
