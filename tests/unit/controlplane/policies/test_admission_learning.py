"""The admission learner: priors before data, convergence on synthetic records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.policies.learning import (
    DEFAULT_PRIOR,
    AdmissionLearner,
    decode_samples,
)
from exporters.records import NUM_PHASES, Phase, RecordBatch, RequestRecord, Status, Vantage

T0 = 1_700_000_000_000_000_000


def test_prior_before_any_data() -> None:
    learner = AdmissionLearner()
    assert learner.params() == DEFAULT_PRIOR
    learner.observe(RecordBatch.from_records([]))
    assert learner.params() == DEFAULT_PRIOR


def test_decode_samples_integrates_the_running_streams() -> None:
    # Stream 0 runs [0, 4]; stream 1 [2, 4] ; stream 2 [4, 6] (touching, not overlapping).
    start = np.array([0.0, 2.0, 4.0])
    end = np.array([4.0, 4.0, 6.0])
    batch, ctx = decode_samples(start, end, np.array([100.0, 300.0, 50.0]))
    assert batch.tolist() == pytest.approx([1.5, 2.0, 1.0])
    assert ctx.tolist() == pytest.approx([250.0, 400.0, 50.0])
    halved, _ = decode_samples(start, end, np.ones(3), num_instances=2)
    assert halved.tolist() == pytest.approx([0.75, 1.0, 0.5])


def _phase_record(i: int, prompt: int, phases: dict[Phase, int]) -> RequestRecord:
    offsets = np.full(NUM_PHASES, -1, dtype=np.int64)
    for phase, value in phases.items():
        offsets[phase] = value
    return RequestRecord(
        request_id=f"p{i}",
        vantage=Vantage.GATEWAY,
        arrival_time_ns=T0 + i * 10**9,
        emission_offsets_us=np.array([phases.get(Phase.KV_HANDOFF_END, 1000) + 10]),
        phase_offsets_us=offsets,
        prompt_tokens=prompt,
    )


def test_prefill_rate_and_handoff_converge() -> None:
    learner = AdmissionLearner()
    rng = np.random.default_rng(3)
    for b in range(10):
        records = []
        for i in range(50):
            prompt = int(rng.integers(100, 4000))
            prefill_us = round(prompt / 4_000.0 * 1e6)  # 4,000 tokens/s
            records.append(
                _phase_record(
                    b * 100 + i,
                    prompt,
                    {
                        Phase.PREFILL_START: 1000,
                        Phase.PREFILL_END: 1000 + prefill_us,
                        Phase.KV_HANDOFF_START: 1000 + prefill_us,
                        Phase.KV_HANDOFF_END: 1000 + prefill_us + 30_000,
                    },
                )
            )
        learner.observe(RecordBatch.from_records(records))
    params = learner.params()
    assert params.prefill_tokens_per_s == pytest.approx(4_000.0, rel=0.02)
    assert params.kv_handoff_s == pytest.approx(0.03, rel=0.05)
    assert params.num_prefill_samples == 500


def _decode_batch(
    rng: np.random.Generator, a: float, b: float, c: float, n: int = 300
) -> RecordBatch:
    """One engine's streams with TPOT = a + b·batch + c·context (batch and context from the
    streams' own overlap), emissions first and last token only."""
    # A quiet minute then a busy quarter-minute: the batch ranges from a few to ~100.
    start = np.sort(np.concatenate([rng.uniform(0, 60, n // 4), rng.uniform(60, 75, n - n // 4)]))
    duration = rng.uniform(5, 30, n)
    prompt = rng.integers(100, 3000, n)
    # Fixed point: the intervals decide batch and context, which decide TPOT; the output
    # length follows (rounded, so the true TPOT is duration/(out - 1)).
    out = np.full(n, 500.0)
    for _ in range(4):
        batch, ctx = decode_samples(start, start + duration, prompt + out / 2)
        out = np.maximum(np.round(duration / (a + b * batch + c * ctx)) + 1, 3)
    records = [
        RequestRecord(
            request_id=f"d{i}",
            vantage=Vantage.ENGINE,
            arrival_time_ns=T0 + round(start[i] * 1e9),
            emission_offsets_us=np.array([0, round(duration[i] * 1e6)]),
            emission_tokens=np.array([1, int(out[i]) - 1], dtype=np.int32),
            prompt_tokens=int(prompt[i]),
            status=Status.OK,
        )
        for i in range(n)
    ]
    return RecordBatch.from_records(records)


@settings(max_examples=8, deadline=None)
@given(
    a=st.floats(0.005, 0.05),
    b=st.floats(1e-4, 2e-3),
    c=st.floats(0.0, 2e-7),
    seed=st.integers(0, 1000),
)
def test_itl_model_converges_on_synthetic_streams(a: float, b: float, c: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    learner = AdmissionLearner(forget=0.95)
    for _ in range(6):
        learner.observe(_decode_batch(rng, a, b, c))
    p = learner.params()
    # The learned model predicts the true ITL within 5 % over the range it saw (batch and
    # total context move together there, so the slopes alone are not identifiable).
    for batch in (20.0, 40.0, 60.0):
        ctx = batch * p.mean_context_tokens
        assert p.itl_s(batch, ctx) == pytest.approx(a + b * batch + c * ctx, rel=0.05)
    assert p.num_itl_samples == 6 * 300
    assert p.mean_decode_s == pytest.approx(17.5, rel=0.15)


def test_failed_and_partial_records_teach_nothing() -> None:
    rng = np.random.default_rng(1)
    batch = _decode_batch(rng, 0.02, 1e-3, 0.0, n=20)
    batch.status[:] = Status.ERROR
    learner = AdmissionLearner()
    learner.observe(batch)
    assert learner.params() == DEFAULT_PRIOR


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="forget must be in"):
        AdmissionLearner(forget=0)
    with pytest.raises(ValueError, match="prior_weight must be"):
        AdmissionLearner(prior_weight=float("nan"))


def test_engine_prefills_done_together_share_their_seconds() -> None:
    # One engine prefills two 1,000-token prompts together in 2 s, then one alone in 1 s:
    # 3,000 tokens in 3 busy seconds. Gateway records (queue included) are then ignored.
    def engine(i: int, arrival_s: float, prefill_s: float) -> RequestRecord:
        offsets = np.full(NUM_PHASES, -1, dtype=np.int64)
        offsets[Phase.PREFILL_START] = 0
        offsets[Phase.PREFILL_END] = round(prefill_s * 1e6)
        return RequestRecord(
            request_id=f"e{i}",
            vantage=Vantage.ENGINE,
            arrival_time_ns=T0 + round(arrival_s * 1e9),
            emission_offsets_us=np.array([round(prefill_s * 1e6)]),
            phase_offsets_us=offsets,
            prompt_tokens=1000,
        )

    learner = AdmissionLearner(prior_weight=1e-9)
    slow = _phase_record(9, 1000, {Phase.PREFILL_START: 0, Phase.PREFILL_END: 10_000_000})
    learner.observe(RecordBatch.from_records([slow]))
    assert learner.params().prefill_tokens_per_s == pytest.approx(100.0, rel=1e-3)
    records = [engine(0, 0.0, 2.0), engine(1, 0.0, 2.0), engine(2, 5.0, 1.0)]
    learner.observe(RecordBatch.from_records(records))
    assert learner.params().prefill_tokens_per_s == pytest.approx(1000.0, rel=1e-3)


def _engine_prefill(i: int, start_us: int, end_us: int, prompt: int) -> RequestRecord:
    offsets = np.full(NUM_PHASES, -1, dtype=np.int64)
    offsets[Phase.PREFILL_START], offsets[Phase.PREFILL_END] = 0, end_us - start_us
    return RequestRecord(
        request_id=f"e{i}",
        vantage=Vantage.ENGINE,
        arrival_time_ns=T0 + start_us * 1000,
        emission_offsets_us=np.array([end_us - start_us]),
        phase_offsets_us=offsets,
        prompt_tokens=prompt,
    )


@pytest.mark.parametrize("per_batch", [1, 7, 400])
def test_engine_busy_time_is_not_counted_twice_across_batches(per_batch: int) -> None:
    # Chunked prefill: each 1000-token prompt takes 50 ms, and consecutive prompts share one
    # 10-ms iteration (prompt i runs [40i, 40i + 50] ms). The instance is busy 40 ms per
    # prompt, 25k tokens/s, however the records are cut into batches (H8 saw 20 % low).
    records = [_engine_prefill(i, 40_000 * i, 40_000 * i + 50_000, 1000) for i in range(400)]
    learner = AdmissionLearner(forget=1.0, prior_weight=1e-9)
    for k in range(0, len(records), per_batch):
        learner.observe(RecordBatch.from_records(records[k : k + per_batch]), source="engine-0")
    assert learner.params().prefill_tokens_per_s == pytest.approx(1000 / 0.040, rel=0.01)


def test_engine_busy_time_is_kept_per_exporter() -> None:
    # Two instances prefilling at the same moments: each is busy its own time.
    a = [_engine_prefill(i, 40_000 * i, 40_000 * i + 40_000, 1000) for i in range(50)]
    learner = AdmissionLearner(forget=1.0, prior_weight=1e-9)
    for k in range(0, 50, 5):
        learner.observe(RecordBatch.from_records(a[k : k + 5]), source="engine-0")
        learner.observe(RecordBatch.from_records(a[k : k + 5]), source="engine-1")
    assert learner.params().prefill_tokens_per_s == pytest.approx(1000 / 0.040, rel=0.01)
