"""Instance model: each batching strategy's defining behaviour, step times from the fitted
curves, and runs of decode iterations equal to stepping one iteration at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from serving.sim import LatencyModel
from serving.sim.instance import Instance, InstanceConfig, Job, JobMode, Strategy, serve
from serving.sim.instance._steps import StepTimer

MODEL = LatencyModel.for_profile("h100-llama3.1-8b")
PREFILL = MODEL.profile.prefill
DECODE = MODEL.profile.decode


def make(strategy: Strategy | str, **options: object) -> Instance:
    return Instance(InstanceConfig(strategy=Strategy(strategy), **options), MODEL)  # type: ignore[arg-type]


class RecordingTimer(StepTimer):
    """Records every iteration's prefill tokens and decodes (runs: one entry per run)."""

    def __init__(self) -> None:
        super().__init__(MODEL)
        self.iterations: list[tuple[int, int]] = []
        self.runs: list[tuple[int, int]] = []

    def iteration_s(
        self, chunk_tokens: int, attention_units: int, num_decodes: int, decode_context: int
    ) -> float:
        self.iterations.append((chunk_tokens, num_decodes))
        return super().iteration_s(chunk_tokens, attention_units, num_decodes, decode_context)

    def decode_run_ends(
        self, start_s: float, batch: int, context: int, growth: int, num_steps: int
    ) -> np.ndarray:
        self.runs.append((growth, num_steps))
        return super().decode_run_ends(start_s, batch, context, growth, num_steps)


def test_one_request_takes_a_prefill_step_then_one_decode_step_per_further_token() -> None:
    inst = make("continuous")
    (job,) = serve(inst, [Job(0, 1.0, 1000, 4)])
    times = job.emission_times()
    first = PREFILL.at(1000.0, 1000.0**2)
    assert times[0] == pytest.approx(1.0 + first, abs=1e-12)
    # Decode step i reads the prompt plus the i tokens generated so far.
    steps = [DECODE.at(1.0, 1000.0 + i) for i in range(3)]
    assert np.diff(times) == pytest.approx(steps, abs=1e-12)
    assert job.finished_s == times[-1]
    assert (job.queued_s, job.prefill_start_s, job.prefill_end_s) == (1.0, 1.0, times[0])


def test_static_batching_waits_for_n_requests() -> None:
    inst = make("static", batch_size=3)
    jobs = [Job(0, 0.0, 200, 5), Job(1, 0.5, 300, 5)]
    assert serve(inst, jobs, close=False) == []
    assert all(math.isnan(j.prefill_start_s) for j in jobs)
    assert inst.next_event_s == math.inf  # nothing scheduled: it waits
    third = Job(2, 4.0, 100, 5)
    inst.submit(third, 4.0)
    assert inst.next_event_s < math.inf
    done = serve(inst, [])
    assert sorted(j.index for j in done) == [0, 1, 2]
    assert {j.prefill_start_s for j in [*jobs, third]} == {4.0}


def test_static_batch_runs_to_the_end_before_the_next_starts() -> None:
    inst = make("static", batch_size=2)
    jobs = [Job(0, 0.0, 100, 3), Job(1, 0.0, 100, 40)]
    jobs += [Job(2, 0.01, 100, 3), Job(3, 0.01, 100, 3)]
    done = serve(inst, jobs)
    first_batch_end = max(jobs[0].finished_s, jobs[1].finished_s)
    assert jobs[2].prefill_start_s == jobs[3].prefill_start_s == first_batch_end
    assert len(done) == 4
    # A finished sequence keeps its seat: after job 0 finished, job 1 still decodes at
    # the cost of a batch of 2 (padding), not 1: its last step reads its own 138 tokens
    # and the 102 job 0 left.
    gaps = np.diff(jobs[1].emission_times())
    assert gaps[-1] == pytest.approx(DECODE.at(2.0, 138.0 + 102.0), abs=1e-12)
    assert gaps[-1] > DECODE.at(1.0, 138.0)


def test_dynamic_batching_starts_a_batch_when_the_window_closes() -> None:
    inst = make("dynamic", batch_size=8, batch_window_s=0.05)
    jobs = [Job(0, 1.0, 100, 2), Job(1, 1.02, 100, 2)]
    serve(inst, jobs, close=False)
    assert jobs[0].prefill_start_s == jobs[1].prefill_start_s == pytest.approx(1.05)


def test_dynamic_batching_starts_at_once_when_the_batch_is_full() -> None:
    inst = make("dynamic", batch_size=2, batch_window_s=10.0)
    jobs = [Job(0, 1.0, 100, 2), Job(1, 1.02, 100, 2)]
    serve(inst, jobs, close=False)
    assert jobs[0].prefill_start_s == jobs[1].prefill_start_s == 1.02


def test_continuous_batching_admits_a_waiting_request_the_iteration_after_one_finishes() -> None:
    inst = make("continuous", max_num_seqs=2)
    short, long = Job(0, 0.0, 500, 3), Job(1, 0.0, 500, 60)
    waiting = Job(2, 0.001, 500, 5)
    serve(inst, [short, long, waiting])
    assert waiting.prefill_start_s == short.finished_s  # the very next boundary
    # Its prefill iteration pauses the running decode (prefill first, no chunking): one
    # gap of the long request spans that whole prefill and its next decode step.
    gaps = np.diff(long.emission_times())
    prefill_s = PREFILL.at(500.0, 500.0**2)
    assert (gaps > prefill_s).sum() == 1
    assert gaps.max() < prefill_s + 2 * DECODE.at(2.0, 1200.0)


def test_continuous_batching_joins_a_running_batch_without_waiting_for_it() -> None:
    inst = make("continuous")
    first, second = Job(0, 0.0, 500, 200), Job(1, 0.5, 500, 5)
    serve(inst, [first, second])
    boundaries = first.emission_times()
    after = boundaries[boundaries >= 0.5]
    assert second.prefill_start_s == after[0]  # the boundary right after its arrival
    assert second.finished_s < first.finished_s


@pytest.mark.parametrize("budget", [64, 256, 1000])
def test_chunked_prefill_never_exceeds_its_token_budget(budget: int) -> None:
    inst = make("chunked", max_num_batched_tokens=budget)
    timer = RecordingTimer()
    inst.timer = timer
    rng = np.random.default_rng(3)
    jobs = [
        Job(i, float(t), int(p), int(o))
        for i, (t, p, o) in enumerate(
            zip(
                np.cumsum(rng.exponential(0.01, 40)),
                rng.integers(10, 3000, 40),
                rng.integers(1, 80, 40),
                strict=True,
            )
        )
    ]
    done = serve(inst, jobs)
    assert len(done) == 40
    assert timer.iterations
    assert max(tokens + decodes for tokens, decodes in timer.iterations) <= budget
    assert max(growth for growth, _ in timer.runs) <= budget
    # Long prompts were split: some iteration carried a chunk cut at the budget.
    assert any(tokens + decodes == budget for tokens, decodes in timer.iterations)
    assert all(j.generated == j.output_tokens for j in done)


def test_chunked_prefill_mixes_decodes_into_prefill_iterations() -> None:
    inst = make("chunked", max_num_batched_tokens=512)
    running, arriving = Job(0, 0.0, 100, 100), Job(1, 0.2, 2000, 3)
    serve(inst, [running, arriving])
    # The long prompt is prefilled in 4 chunks while the running request keeps
    # producing a token every iteration (no gap as long as a whole prefill).
    gaps = np.diff(running.emission_times())
    assert gaps.max() < PREFILL.at(2000.0, 2000.0**2) / 2
    assert arriving.prefill_end_s > arriving.prefill_start_s


def test_prefill_jobs_complete_at_their_prefill_end_with_no_token() -> None:
    inst = make("chunked")
    job = Job(0, 0.0, 800, 50, mode=JobMode.PREFILL)
    (done,) = serve(inst, [job])
    assert done is job and job.generated == 0 and job.emissions == []
    assert job.prefill_end_s == pytest.approx(PREFILL.at(800.0, 800.0**2))
    assert math.isnan(job.finished_s)
    assert inst.kv.owned == 0


def test_decode_jobs_need_no_prefill_and_make_every_token() -> None:
    inst = make("continuous")
    job = Job(0, 0.0, 800, 4)
    job.mode = JobMode.DECODE
    job.computed = 800
    (done,) = serve(inst, [job])
    assert done.generated == 4
    assert np.diff(np.concatenate(([0.0], done.emission_times()))) == pytest.approx(
        [DECODE.at(1.0, 800.0 + i) for i in range(4)], abs=1e-12
    )


@pytest.mark.parametrize("strategy", list(Strategy))
@pytest.mark.parametrize("capacity", [None, 3000])
def test_runs_of_decode_iterations_equal_one_iteration_at_a_time(
    strategy: Strategy, capacity: int | None
) -> None:
    rng = np.random.default_rng(7)
    n = 80
    arrivals = np.cumsum(rng.exponential(0.02, n))
    prompts, outputs = rng.integers(20, 1500, n), rng.integers(1, 120, n)

    def run(max_steps: int | None) -> tuple[dict[int, np.ndarray], int]:
        inst = make(
            strategy,
            batch_size=4,
            max_num_seqs=16,
            kv_capacity_tokens=capacity,
            max_segment_steps=max_steps,
        )
        jobs = [Job(i, float(arrivals[i]), int(prompts[i]), int(outputs[i])) for i in range(n)]
        return {j.index: j.emission_times() for j in serve(inst, jobs)}, inst.stats.num_preemptions

    fast, fast_preemptions = run(None)
    slow, slow_preemptions = run(1)
    assert fast.keys() == slow.keys() == set(range(n))
    assert fast_preemptions == slow_preemptions
    for index, times in fast.items():
        assert times == pytest.approx(slow[index], abs=1e-9)


def test_jitter_scales_step_times_within_its_ratio_and_follows_the_seed() -> None:
    def times(seed: int) -> np.ndarray:
        inst = Instance(InstanceConfig(jitter_ratio=0.1), MODEL, seed=seed)
        (job,) = serve(inst, [Job(0, 0.0, 300, 50)])
        return np.diff(job.emission_times())

    plain = np.array([DECODE.at(1.0, 300.0 + i) for i in range(49)])
    ratio = times(1) / plain
    assert ratio.min() >= 0.9 and ratio.max() <= 1.1 and ratio.std() > 0.01
    assert (times(1) == times(1)).all()
    assert not (times(1) == times(2)).all()


def test_config_errors_name_the_field_and_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"strategy must be one of \['static', 'dynamic'"):
        InstanceConfig(strategy="greedy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_num_seqs must be an integer >= 1, got 0"):
        InstanceConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="prefix_block_tokens must be a positive multiple"):
        InstanceConfig(prefix_block_tokens=100)
    with pytest.raises(ValueError, match="weights leave no room"):
        Instance(InstanceConfig(memory_utilization=0.1), MODEL)
