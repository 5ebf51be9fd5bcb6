"""The demo's stand-in latency model: queueing, batching, slots, determinism, contract."""

from __future__ import annotations

import math

import numpy as np
import pytest

from serving.replay.latency_model import ModelParams, ReplayLatencyModel, RequestTimings

EXACT = ModelParams(jitter_ratio=0.0)
# Prefill and KV transfer take no time: every request is ready for decode at its arrival.
INSTANT_PREFILL = ModelParams(
    prefill_base_s=0.0, prefill_tokens_per_s=1e30, kv_link_bytes_per_s=1e30, jitter_ratio=0.0
)


def run(
    model: ReplayLatencyModel, arrival_s: list[float], inputs: list[int], outputs: list[int]
) -> list[RequestTimings]:
    model.submit(np.array(arrival_s, dtype=np.float64), np.array(inputs), np.array(outputs))
    done = model.advance(math.inf)
    return sorted(done, key=lambda t: t.index)


def ttft(t: RequestTimings) -> float:
    return float(t.emission_s[0] - t.arrival_s)


def test_ttft_grows_with_the_prefill_queue_fifo() -> None:
    p = EXACT
    done = run(ReplayLatencyModel(p), [0.0] * 5, [1000] * 5, [2] * 5)
    service = p.prefill_base_s + 1000 / p.prefill_tokens_per_s
    kv = 1000 * p.kv_bytes_per_token / p.kv_link_bytes_per_s
    assert [t.prefill_start_s for t in done] == pytest.approx([k * service for k in range(5)])
    assert [ttft(t) for t in done] == pytest.approx([(k + 1) * service + kv for k in range(5)])


def test_an_idle_prefill_server_starts_at_arrival() -> None:
    p = EXACT
    done = run(ReplayLatencyModel(p), [0.0, 10.0], [2000, 10], [1, 1])
    assert done[1].prefill_start_s == 10.0
    kv = 10 * p.kv_bytes_per_token / p.kv_link_bytes_per_s
    assert ttft(done[1]) == pytest.approx(p.prefill_base_s + 10 / p.prefill_tokens_per_s + kv)


def test_vectorised_prefill_matches_the_sequential_recursion() -> None:
    rng = np.random.default_rng(7)
    arrival = np.cumsum(rng.exponential(0.03, 300))
    inputs = rng.integers(0, 4000, 300)
    p = ModelParams(jitter_ratio=0.0)
    done = run(ReplayLatencyModel(p), arrival.tolist(), inputs.tolist(), [1] * 300)
    free = 0.0
    for t, a, n in zip(done, arrival.tolist(), inputs.tolist(), strict=True):
        start = max(a, free)
        free = start + p.prefill_base_s + n / p.prefill_tokens_per_s
        assert t.prefill_start_s == pytest.approx(start, abs=1e-9)
        assert t.prefill_end_s == pytest.approx(free, abs=1e-9)


def test_the_first_token_waits_for_the_kv_transfer() -> None:
    p = EXACT
    (t,) = run(ReplayLatencyModel(p), [0.0], [8192], [1])
    assert t.kv_end_s - t.prefill_end_s == pytest.approx(8192 * 131_072 / 50e9)
    assert t.emission_s.tolist() == [t.kv_end_s]


@pytest.mark.parametrize("batch", [1, 16, 200])
def test_itl_is_the_step_time_of_the_running_batch(batch: int) -> None:
    p = INSTANT_PREFILL
    done = run(ReplayLatencyModel(p), [0.0] * batch, [0] * batch, [6] * batch)
    step_s = p.decode_base_s + p.decode_per_seq_s * batch
    for t in done:
        assert t.emission_s[0] == 0.0
        np.testing.assert_allclose(np.diff(t.emission_s), [step_s] * 5)


def test_itl_grows_with_the_batch_and_falls_as_requests_leave() -> None:
    p = INSTANT_PREFILL
    done = run(ReplayLatencyModel(p), [0.0] * 50, [0] * 50, [3] * 49 + [6])
    gaps = np.diff(done[-1].emission_s)
    # Two steps with all 50 running, then three alone once the others finished.
    np.testing.assert_allclose(gaps[:2], p.decode_base_s + 50 * p.decode_per_seq_s)
    np.testing.assert_allclose(gaps[2:], p.decode_base_s + 1 * p.decode_per_seq_s)


def test_a_ready_request_joins_at_the_next_step_boundary() -> None:
    p = INSTANT_PREFILL
    step_1 = p.decode_base_s + p.decode_per_seq_s
    done = run(ReplayLatencyModel(p), [0.0, 0.5 * step_1], [0, 0], [4, 3])
    late = done[1]
    # It arrives mid-step: its second token comes at the end of the next (two-request) step.
    step_2 = p.decode_base_s + 2 * p.decode_per_seq_s
    assert late.emission_s[1] == pytest.approx(step_1 + step_2)


def test_a_full_decode_batch_makes_ready_requests_wait_for_a_slot() -> None:
    p = ModelParams(
        prefill_base_s=0.0,
        prefill_tokens_per_s=1e30,
        kv_link_bytes_per_s=1e30,
        jitter_ratio=0.0,
        max_num_seqs=2,
    )
    done = run(ReplayLatencyModel(p), [0.0, 0.0, 0.0], [0, 0, 0], [4, 4, 4])
    step_2 = p.decode_base_s + 2 * p.decode_per_seq_s
    step_1 = p.decode_base_s + p.decode_per_seq_s
    assert done[0].finish_s == done[1].finish_s == pytest.approx(3 * step_2)
    # The third joins once a slot frees: its first gap is the whole wait.
    assert done[2].emission_s[1] == pytest.approx(3 * step_2 + step_1)
    assert len(done[2].emission_s) == 4


def test_advance_returns_each_request_once_when_finished_in_finish_order() -> None:
    rng = np.random.default_rng(3)
    n = 200
    arrival = np.sort(rng.uniform(0, 5, n))
    model = ReplayLatencyModel(ModelParams(), seed=1)
    model.submit(arrival, rng.integers(1, 3000, n), rng.integers(1, 300, n))
    seen: list[int] = []
    for until in np.arange(0.1, 60.0, 0.1).tolist():
        done = model.advance(until)
        finishes = [t.finish_s for t in done]
        assert finishes == sorted(finishes)
        assert all(f <= until for f in finishes)
        seen.extend(t.index for t in done)
    assert sorted(seen) == list(range(n))


def test_output_lengths_set_the_token_count_and_zero_counts_as_one() -> None:
    done = run(
        ReplayLatencyModel(ModelParams(), seed=2), [0.0, 0.0, 0.1], [10, 500, 20], [0, 1, 37]
    )
    assert [len(t.emission_s) for t in done] == [1, 1, 37]
    for t in done:
        assert (np.diff(t.emission_s) >= 0).all()


def trace_like(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = 400
    return (
        np.cumsum(rng.exponential(0.05, n)),
        rng.integers(10, 6000, n),
        rng.integers(1, 400, n),
    )


def as_tuples(done: list[RequestTimings]) -> list[tuple[int, list[float]]]:
    return sorted((t.index, t.emission_s.tolist()) for t in done)


def test_same_seed_same_times_and_another_seed_other_times() -> None:
    arrival, inputs, outputs = trace_like(0)

    def once(seed: int) -> list[tuple[int, list[float]]]:
        model = ReplayLatencyModel(ModelParams(), seed=seed)
        model.submit(arrival, inputs, outputs)
        return as_tuples(model.advance(math.inf))

    assert once(5) == once(5)
    assert once(5) != once(6)


def test_results_do_not_depend_on_how_calls_are_split() -> None:
    arrival, inputs, outputs = trace_like(1)
    whole = ReplayLatencyModel(ModelParams(), seed=9)
    whole.submit(arrival, inputs, outputs)
    expected = as_tuples(whole.advance(math.inf))

    paced = ReplayLatencyModel(ModelParams(), seed=9)
    done: list[RequestTimings] = []
    next_row = 0
    for until in np.arange(0.0, arrival[-1] + 0.25, 0.25).tolist():
        hi = int(np.searchsorted(arrival, until, side="right"))
        paced.submit(arrival[next_row:hi], inputs[next_row:hi], outputs[next_row:hi])
        next_row = hi
        done.extend(paced.advance(until))
    done.extend(paced.advance(math.inf))
    got = as_tuples(done)
    assert [index for index, _ in got] == [index for index, _ in expected]
    for (_, times), (_, expected_times) in zip(got, expected, strict=True):
        # Chunked cumulative sums round differently in the last bit, nothing more.
        np.testing.assert_allclose(times, expected_times, rtol=0, atol=1e-12)


def test_submit_refuses_arrivals_out_of_order_or_before_the_model_time() -> None:
    model = ReplayLatencyModel()
    with pytest.raises(ValueError, match=r"arrival_s must be finite, non-decreasing and >= 0.0"):
        model.submit(np.array([1.0, 0.5]), np.array([1, 1]), np.array([1, 1]))
    model.advance(2.0)
    with pytest.raises(ValueError, match=r">= 2.0 \(the last arrival or advance\), got \[1.5\]"):
        model.submit(np.array([1.5]), np.array([1]), np.array([1]))
    with pytest.raises(ValueError, match=r"must have 1 values like arrival_s, got \(2,\) and"):
        model.submit(np.array([3.0]), np.array([1, 2]), np.array([1]))
    with pytest.raises(ValueError, match=r"input_tokens and output_tokens must be >= 0"):
        model.submit(np.array([3.0]), np.array([-1]), np.array([1]))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prefill_tokens_per_s", 0.0, r"prefill_tokens_per_s must be in \(0, inf\), got 0.0"),
        ("decode_base_s", math.nan, r"decode_base_s must be in \(0, inf\), got nan"),
        ("jitter_ratio", 1.0, r"jitter_ratio must be in \[0, 1\), got 1.0"),
        ("prefill_base_s", -0.1, r"prefill_base_s must be in \[0, inf\), got -0.1"),
        ("max_num_seqs", 0, r"max_num_seqs must be in \(0, inf\), got 0"),
    ],
)
def test_params_name_the_field_the_value_and_the_allowed_range(
    field: str, value: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ModelParams(**{field: value})  # type: ignore[arg-type]
