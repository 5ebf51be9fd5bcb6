"""SLO verdicts: objective validation, judge() against the reference, and the stated rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporters._reference import reference_judge, reference_measured
from exporters.latency import request_latencies
from exporters.records import (
    Phase,
    RecordBatch,
    RecordError,
    RequestRecord,
    Status,
    TokenDetail,
    Vantage,
)
from exporters.slo import Metric, Objective, SLOError, Verdicts, judge


@st.composite
def records(draw: st.DrawFn, index: int) -> RequestRecord:
    """One record: 0..6 emissions (often equal times), chunks of k >= 1, any detail/status."""
    num = draw(st.sampled_from([0, 1, 1, 2, 3, 6]))
    steps = draw(st.lists(st.integers(0, 3) | st.integers(0, 200_000), min_size=num, max_size=num))
    offsets = np.cumsum(np.array(steps, dtype=np.int64)) + draw(st.integers(0, 400_000))
    tokens = draw(st.none() | st.lists(st.integers(1, 5), min_size=num, max_size=num))
    phases = np.full(6, -1, dtype=np.int64)
    phases[Phase.FINISHED] = draw(st.sampled_from([-1, 0, 300_000, 900_000]))
    return RequestRecord(
        request_id=f"r{index}",
        vantage=Vantage.GATEWAY,
        arrival_time_ns=0,
        emission_offsets_us=offsets.astype(np.int64),
        emission_tokens=None if tokens is None else np.array(tokens, dtype=np.int32),
        token_detail=draw(st.sampled_from(TokenDetail)),
        phase_offsets_us=phases,
        status=draw(st.sampled_from(Status)),
        final=draw(st.booleans()),
    )


@st.composite
def record_lists(draw: st.DrawFn) -> list[RequestRecord]:
    size = draw(st.integers(0, 12))
    return [draw(records(i)) for i in range(size)]


# Thresholds on the µs grid too, so that ties (value == threshold) actually occur.
thresholds = st.sampled_from([1e-6, 0.001, 0.05, 0.1, 0.2, 0.3, 1.0]) | st.integers(1, 600_000).map(
    lambda us: us / 1e6
)

objectives = st.builds(
    Objective,
    metric=st.sampled_from([Metric.TTFT, Metric.TPOT, Metric.E2EL]),
    threshold_s=thresholds,
) | st.builds(
    Objective,
    metric=st.just(Metric.ITL),
    threshold_s=thresholds,
    statistic=st.sampled_from(["max", "p50", "p90", "p99", "p99.9", "p100", "p12.5"]),
)


@settings(deadline=None, max_examples=300)
@given(record_lists(), st.lists(objectives, max_size=5))
def test_judge_equals_the_reference(recs: list[RequestRecord], objs: list[Objective]) -> None:
    verdicts = judge(RecordBatch.from_records(recs), objs)
    good, met, judged = reference_judge(recs, objs)
    assert verdicts.good.tolist() == good
    assert verdicts.judged.tolist() == judged
    assert verdicts.met.shape == (len(recs), len(objs))
    assert verdicts.met.tolist() == met
    measured = [[reference_measured(r, o) for o in objs] for r in recs]
    assert verdicts.measured.tolist() == measured
    assert verdicts.num_good == sum(good)
    assert verdicts.num_judged == sum(judged)
    assert verdicts.num_measured == [
        sum(judged[i] and measured[i][k] for i in range(len(recs))) for k in range(len(objs))
    ]


@settings(deadline=None, max_examples=300)
@given(record_lists(), st.lists(objectives, max_size=5))
def test_unmeasured_objectives_neither_pass_nor_fail(
    recs: list[RequestRecord], objs: list[Objective]
) -> None:
    """Properties of the measured/met split, whatever the records."""
    verdicts = judge(RecordBatch.from_records(recs), objs)
    # met and violated only where measured, and they partition the measured cells.
    assert not (verdicts.met & ~verdicts.measured).any()
    assert np.array_equal(verdicts.met ^ verdicts.violated, verdicts.measured)
    # good = judged, OK and nothing violated: unmeasured never makes a request bad.
    ok = np.array([r.status == Status.OK for r in recs], dtype=np.bool_)
    assert np.array_equal(verdicts.good, verdicts.judged & ok & ~verdicts.violated.any(axis=1))
    # Dropping the unmeasured objectives of a row never changes its verdict: judging each
    # row only on its measured objectives gives the same good.
    for i, rec in enumerate(recs):
        kept = [o for k, o in enumerate(objs) if verdicts.measured[i, k]]
        alone = judge(RecordBatch.from_records([rec]), kept)
        assert bool(alone.good[0]) == bool(verdicts.good[i])
        assert alone.measured.all()
    # Only ITL and E2EL can be unmeasured; a FULL record with a finish or a token carries all.
    for i, rec in enumerate(recs):
        for k, objective in enumerate(objs):
            if not verdicts.measured[i, k]:
                assert objective.metric in (Metric.ITL, Metric.E2EL)
                if objective.metric is Metric.ITL:
                    assert rec.token_detail is TokenDetail.SUMMARY


@settings(deadline=None)
@given(record_lists(), st.lists(objectives, max_size=4))
def test_judge_reuses_given_latencies(recs: list[RequestRecord], objs: list[Objective]) -> None:
    batch = RecordBatch.from_records(recs)
    fresh = judge(batch, objs)
    reused = judge(batch, objs, request_latencies(batch))
    np.testing.assert_array_equal(fresh.good, reused.good)
    np.testing.assert_array_equal(fresh.met, reused.met)
    np.testing.assert_array_equal(fresh.judged, reused.judged)
    np.testing.assert_array_equal(fresh.measured, reused.measured)


def _rec(
    offsets: list[int],
    status: Status = Status.OK,
    *,
    tokens: list[int] | None = None,
    detail: TokenDetail = TokenDetail.FULL,
    final: bool = True,
    request_id: str = "r",
) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        vantage=Vantage.GATEWAY,
        arrival_time_ns=0,
        emission_offsets_us=np.array(offsets, dtype=np.int64),
        emission_tokens=None if tokens is None else np.array(tokens, dtype=np.int32),
        token_detail=detail,
        status=status,
        final=final,
    )


def _judge(recs: list[RequestRecord], objs: list[Objective]) -> Verdicts:
    return judge(RecordBatch.from_records(recs), objs)


# One objective per metric and ITL statistic, all at 1 ms.
EVERY_METRIC_1MS = [
    Objective(Metric.TTFT, 0.001),
    Objective(Metric.TPOT, 0.001),
    Objective(Metric.ITL, 0.001),
    Objective(Metric.ITL, 0.001, "p99"),
    Objective(Metric.E2EL, 0.001),
]


def test_thresholds_are_inclusive() -> None:
    verdicts = _judge(
        [_rec([200_000, 250_000]), _rec([200_001, 250_000])], [Objective(Metric.TTFT, 0.2)]
    )
    assert verdicts.met.tolist() == [[True], [False]]
    assert verdicts.good.tolist() == [True, False]


def test_undefined_metrics_are_met() -> None:
    objs = EVERY_METRIC_1MS
    one_token = _rec([500])  # TPOT and ITL undefined; TTFT/E2EL = 0.5 ms
    one_chunk = _rec([500], tokens=[4])  # one chunk of 4: no gap, TPOT 0
    summary_one = _rec([500], detail=TokenDetail.SUMMARY)  # one token: no gap to carry
    verdicts = _judge([one_token, one_chunk, summary_one], objs)
    assert verdicts.measured.all()
    assert verdicts.met.all()
    assert verdicts.good.tolist() == [True, True, True]


def test_metrics_a_record_does_not_carry_are_unmeasured() -> None:
    objs = EVERY_METRIC_1MS
    summary = _rec([500, 900], tokens=[1, 1], detail=TokenDetail.SUMMARY)  # gaps not carried
    slow_summary = _rec([500, 9_000], tokens=[1, 2], detail=TokenDetail.SUMMARY)
    nothing = _rec([])  # OK without a token or a finish time: E2EL not carried
    errored = _rec([500, 900], Status.ERROR, tokens=[1, 1], detail=TokenDetail.SUMMARY)
    verdicts = _judge([summary, slow_summary, nothing, errored], objs)
    assert verdicts.measured.tolist() == [
        [True, True, False, False, True],
        [True, True, False, False, True],
        [True, True, True, True, False],
        [True, True, False, False, True],
    ]
    assert verdicts.met.tolist() == [
        [True, True, False, False, True],
        [True, False, False, False, False],  # TPOT 4.25 ms and E2EL 9 ms break 1 ms
        [True, True, True, True, False],
        [True, True, False, False, True],
    ]
    assert not (verdicts.violated[:, 2:4]).any()  # unmeasured is never a violation
    assert verdicts.good.tolist() == [True, False, True, False]
    assert verdicts.num_measured == [4, 4, 1, 1, 3]


def test_itl_max_and_percentile_objectives() -> None:
    # Gaps of 10 ms x 99 and one of 500 ms: max fails a 50 ms ITL objective, p90 meets it.
    offsets = np.cumsum([0] + [10_000] * 99 + [500_000]).tolist()
    objs = [Objective(Metric.ITL, 0.05), Objective(Metric.ITL, 0.05, "p90")]
    assert _judge([_rec(offsets)], objs).met.tolist() == [[False, True]]


def test_statuses_decide_who_is_judged_and_good() -> None:
    fast = [10, 20]
    recs = [
        _rec(fast, Status.OK),
        _rec(fast, Status.ERROR),
        _rec(fast, Status.ABORTED),
        _rec(fast, Status.REJECTED),
        _rec(fast, Status.IN_FLIGHT, final=False),
        _rec(fast, Status.OK, final=False),
    ]
    verdicts = _judge(recs, [Objective(Metric.TTFT, 1.0)])
    assert verdicts.judged.tolist() == [True, True, False, False, False, False]
    assert verdicts.good.tolist() == [True, False, False, False, False, False]
    assert verdicts.met.all()  # met is computed for every row, judged or not


def test_no_objectives_means_good_is_judged_and_ok() -> None:
    verdicts = _judge([_rec([1]), _rec([1], Status.ERROR)], [])
    assert verdicts.met.shape == (2, 0)
    assert verdicts.good.tolist() == [True, False]


def test_empty_batch() -> None:
    verdicts = judge(RecordBatch.empty(), [Objective(Metric.ITL, 0.1, "p99")])
    assert verdicts.met.shape == (0, 1)
    assert verdicts.good.shape == verdicts.judged.shape == (0,)
    assert verdicts.num_good == verdicts.num_judged == 0


def test_non_monotonic_token_times_are_rejected_naming_the_request() -> None:
    batch = RecordBatch.from_records([_rec([5, 4], request_id="late")])
    with pytest.raises(RecordError) as err:
        judge(batch, [Objective(Metric.TTFT, 1.0)])
    assert str(err.value) == (
        "emission_offsets_us: non-monotonic token times in request 'late' at emission 1"
    )


def test_latencies_of_another_batch_are_rejected() -> None:
    batch = RecordBatch.from_records([_rec([1]), _rec([2])])
    other = request_latencies(RecordBatch.from_records([_rec([1])]))
    with pytest.raises(SLOError) as err:
        judge(batch, [Objective(Metric.TTFT, 1.0)], other)
    assert str(err.value) == "latencies: expected 2 rows (one per request), got 1"


def test_objectives_must_be_objectives() -> None:
    with pytest.raises(SLOError) as err:
        _judge([_rec([1])], [("ttft", 0.2)])  # type: ignore[list-item]
    assert str(err.value) == "objectives[0] must be an Objective, got ('ttft', 0.2)"


def test_objective_normalises_metric_and_threshold() -> None:
    objective = Objective("ttft", 1)  # type: ignore[arg-type]
    assert objective.metric is Metric.TTFT
    assert objective.threshold_s == 1.0 and isinstance(objective.threshold_s, float)
    assert objective.statistic == "max"
    assert objective.percentile is None
    assert Objective(Metric.ITL, 0.05, "p99.9").percentile == 99.9
    assert Objective(Metric.ITL, 0.05, "p100").percentile == 100.0
    assert Objective(Metric.ITL, 0.05, "p99") == Objective("itl", 0.05, "p99")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold_s": -1}, "objective.threshold_s must be > 0, got -1"),
        ({"threshold_s": 0.0}, "objective.threshold_s must be > 0, got 0.0"),
        ({"threshold_s": math.nan}, "objective.threshold_s must be finite, got nan"),
        ({"threshold_s": math.inf}, "objective.threshold_s must be finite, got inf"),
        ({"threshold_s": "0.2"}, "objective.threshold_s must be a number, got '0.2'"),
        ({"threshold_s": True}, "objective.threshold_s must be a number, got True"),
        (
            {"metric": "latency"},
            "objective.metric must be one of ['ttft', 'tpot', 'itl', 'e2el'], got 'latency'",
        ),
        (
            {"statistic": "p99"},
            "objective.statistic for ttft must be 'max' (one value per request), got 'p99'",
        ),
        (
            {"metric": Metric.E2EL, "statistic": "value"},
            "objective.statistic for e2el must be 'max' (one value per request), got 'value'",
        ),
        ({"statistic": None}, "objective.statistic must be a string, got None"),
    ],
)
def test_objective_errors_name_the_field_and_value(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"metric": Metric.TTFT, "threshold_s": 0.2, **kwargs}
    with pytest.raises(SLOError) as err:
        Objective(**args)  # type: ignore[arg-type]
    assert str(err.value) == message


@pytest.mark.parametrize("statistic", ["p0", "p101", "p100.5", "p", "P99", "99", "p-1", "mean"])
def test_itl_statistic_must_be_max_or_a_percentile(statistic: str) -> None:
    with pytest.raises(SLOError) as err:
        Objective(Metric.ITL, 0.05, statistic)
    assert str(err.value) == (
        "objective.statistic for itl must be 'max' or 'pNN' with 0 < NN <= 100 "
        f"(e.g. 'p99', 'p99.9'), got {statistic!r}"
    )


def test_slo_error_is_a_value_error() -> None:
    assert issubclass(SLOError, ValueError)
