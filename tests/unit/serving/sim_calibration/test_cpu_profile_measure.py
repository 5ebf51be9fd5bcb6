"""The measurement script's pure parts: decode step times from streamed tokens, medians."""

from __future__ import annotations

import numpy as np
import pytest

from exporters.records import RequestRecord, Vantage
from serving.sim.calibration.measure_cpu import (
    decode_step,
    differential_step,
    engine_itl,
    median_rows,
)
from serving.sim.calibration.profiles import format_step_csv, parse_step_csv


def stream(start_s: float, first_token_s: float, step_s: float, tokens: int,
           chunks: tuple[int, ...] = ()) -> RequestRecord:  # fmt: skip
    """A client record: arrival at ``start_s``, first token at ``first_token_s``, then one
    token per ``step_s``; ``chunks`` lists emissions (by index) that carry two tokens."""
    times = first_token_s + step_s * np.arange(tokens)
    counts = np.ones(tokens, dtype=np.int32)
    for i in sorted(chunks, reverse=True):  # merge token i+1 into emission i
        counts[i] += 1
        counts = np.delete(counts, i + 1)
        times = np.delete(times, i)
    return RequestRecord(
        request_id=f"r{start_s}",
        vantage=Vantage.GATEWAY,
        arrival_time_ns=round(start_s * 1e9),
        emission_offsets_us=np.rint((times - start_s) * 1e6).astype(np.int64),
        emission_tokens=counts,
    )


def test_the_steady_part_gives_the_step_time_and_the_batch_context() -> None:
    # Three streams of 100-token prompts whose first tokens land 2 ms apart, then 5 ms steps.
    records = [stream(0.0, 0.050 + 0.002 * k, 0.005, 40) for k in range(3)]
    result = decode_step(records, prompt_tokens=100)
    assert result is not None
    context, step_s = result
    assert step_s == pytest.approx(0.005, rel=1e-3)
    # Steady from the last first token (stream 2's, 54 ms) to the first last token (stream
    # 0's, 245 ms): stream 1 is in it from its 2nd to its 39th token, 20.5 at the middle,
    # the median of the three (21, 20.5, 20).
    assert context == round(3 * (100 + 20.5))


def test_a_chunk_of_two_tokens_counts_as_two_steps() -> None:
    result = decode_step([stream(0.0, 0.05, 0.004, 30, chunks=(10, 20))], prompt_tokens=16)
    assert result is not None and result[1] == pytest.approx(0.004, rel=1e-3)


def test_streams_that_never_overlap_give_nothing() -> None:
    apart = [stream(0.0, 0.01, 0.005, 10), stream(1.0, 1.01, 0.005, 10)]
    assert decode_step(apart, 16) is None
    assert decode_step([], 16) is None
    assert decode_step([stream(0.0, 0.01, 0.005, 1)], 16) is None


def test_rows_are_the_median_of_the_repeats_and_parse_as_a_step_csv() -> None:
    rows = median_rows({
        ("prefill", 1, 64, 64 * 64, 64): [(0, 0.03), (0, 0.01), (0, 0.02)],
        ("decode", 4, 4, 0, 190): [(790, 0.006), (810, 0.005)],
    })  # fmt: skip
    assert rows == [("decode", 4, 4, 0, 800, 0.0055), ("prefill", 1, 64, 4096, 0, 0.02)]
    prefill, decode = parse_step_csv(format_step_csv(rows))
    assert (prefill.x.tolist(), prefill.w.tolist(), prefill.y.tolist()) == ([64], [4096], [0.02])
    assert (decode.x.tolist(), decode.w.tolist(), decode.y.tolist()) == ([4], [800], [0.0055])


METRICS = """\
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="tiny"} 90.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 100.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="tiny"} 100.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="tiny"} 0.5
vllm:inter_token_latency_seconds_count{engine="1",model_name="tiny"} 20.0
vllm:inter_token_latency_seconds_sum{engine="1",model_name="tiny"} 0.25
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny"} 7.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny"} 9.0
"""


def test_the_engine_itl_histogram_is_summed_over_its_label_sets() -> None:
    assert engine_itl(METRICS) == (0.75, 120.0)
    assert engine_itl("") == (0.0, 0.0)


def test_the_ramp_both_runs_share_cancels() -> None:
    # Both runs: a ramp of 10 gaps totalling 0.5 s; then 8·7 vs 8·71 steady gaps of 4 ms.
    ramp_s, ramp_n, step_s = 0.5, 10, 0.004
    short = (ramp_s + 8 * 7 * step_s, ramp_n + 8 * 7)
    long = (ramp_s + 8 * 71 * step_s, ramp_n + 8 * 71)
    assert differential_step(short, long) == pytest.approx(step_s)
    assert differential_step(long, short) is None
    assert differential_step((1.0, 5), (0.9, 9)) is None
