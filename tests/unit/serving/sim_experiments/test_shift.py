"""The workload-shift transform and the recovery time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from serving.sim.cluster import Workload, build_workload
from serving.sim.experiments.shift import bucket_attainment, recovery_s, shift_inputs
from serving.traces import Trace


def workload(n: int = 100) -> Workload:
    rng = np.random.default_rng(3)
    trace = Trace(
        np.sort(rng.uniform(0, 50, n)), rng.integers(10, 500, n), rng.integers(1, 50, n), None, "t"
    )
    return build_workload(trace, rate_scale=1.0, duration_s=60.0)


def test_prompts_after_the_shift_are_scaled_and_nothing_else_changes() -> None:
    work = workload()
    out = shift_inputs(work, 25.0, 4.0)
    after = work.arrival_s >= 25.0
    assert after.any() and (~after).any()
    assert (out.prompt_tokens[after] == work.prompt_tokens[after] * 4).all()
    assert (out.prompt_tokens[~after] == work.prompt_tokens[~after]).all()
    assert (out.arrival_s == work.arrival_s).all()
    assert (out.output_tokens == work.output_tokens).all()
    assert (out.trace_rows == work.trace_rows).all()
    assert (work.prompt_tokens == workload().prompt_tokens).all()  # input untouched
    assert "shift" in out.name


def test_scaled_prompts_are_capped_to_fit_the_kv_cache() -> None:
    work = workload()
    out = shift_inputs(work, 0.0, 100.0, max_context_tokens=2000)
    assert (out.prompt_tokens + out.output_tokens <= 2000).all()
    assert out.prompt_tokens.max() == 2000 - out.output_tokens[out.prompt_tokens.argmax()]


def test_shift_factor_below_one_shortens_and_keeps_at_least_one_token() -> None:
    out = shift_inputs(workload(), 0.0, 1e-6)
    assert (out.prompt_tokens == 1).all()


@pytest.mark.parametrize(("at_s", "factor"), [(0.0, 0.0), (0.0, math.inf), (math.nan, 2.0)])
def test_invalid_shift_is_refused(at_s: float, factor: float) -> None:
    with pytest.raises(ValueError, match=r"factor|at_s"):
        shift_inputs(workload(), at_s, factor)


def verdicts(bad_until: float, end: float = 100.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    arrival = np.arange(0.0, end, 0.5)
    good = ~((arrival >= 50.0) & (arrival < bad_until))
    return arrival, good, np.ones_like(good)


def test_recovery_is_the_start_of_the_first_bucket_after_the_last_miss() -> None:
    arrival, good, judged = verdicts(bad_until=73.0)
    got = recovery_s(arrival, good, judged, shift_s=50.0, end_s=100.0, target=0.95)
    assert got == 30.0  # buckets [50,60), [60,70), [70,80) miss; from 80 s on all good


def test_no_dip_is_zero_and_a_miss_to_the_end_is_infinite() -> None:
    arrival, good, judged = verdicts(bad_until=50.0)
    assert recovery_s(arrival, good, judged, shift_s=50.0, end_s=100.0, target=0.95) == 0.0
    arrival, good, judged = verdicts(bad_until=100.0)
    got = recovery_s(arrival, good, judged, shift_s=50.0, end_s=100.0, target=0.95)
    assert math.isinf(got)


def test_bucket_attainment_counts_judged_only_and_empty_buckets_are_met() -> None:
    arrival = np.array([0.5, 1.5, 2.5, 12.5])
    good = np.array([True, False, False, True])
    judged = np.array([True, True, False, True])  # the third was rejected
    starts, ratio = bucket_attainment(arrival, good, judged, start_s=0.0, end_s=30.0, bucket_s=10.0)
    assert starts.tolist() == [0.0, 10.0, 20.0]
    assert ratio.tolist() == [0.5, 1.0, 1.0]
