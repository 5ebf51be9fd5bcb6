"""Profile readers, on in-memory text: LLMServingSim layers, Splitwise, Vidur, step samples."""

from __future__ import annotations

import numpy as np
import pytest

from serving.sim.calibration.profiles import (
    ProfileFormatError,
    format_step_csv,
    parse_collective_csv,
    parse_layers_csv,
    parse_splitwise_csv,
    parse_step_csv,
)

LAYERS = """layer_name,input,kv_cache,tp_size,latency(ns)
embedding,1,0,2,3000
attn,1,0,2,5000
embedding,2,0,2,3500
attn,2,0,2,9000
"""

SPLITWISE = (
    "model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,"
    "prompt_time,token_time,e2e_time,tensor_parallel\n"
    """llama2-70b,h100-80gb,512,1,128,0.0,0.0,85.0,37.0,4784.0,2
llama2-70b,a100-80gb,512,1,128,0.0,0.0,150.0,60.0,7800.0,2
bloom-176b,h100-80gb,512,1,128,0.0,0.0,90.0,40.0,5200.0,8
llama2-70b,h100-80gb,1024,4,128,0.0,0.0,400.0,40.0,5500.0,4
"""
)

COLLECTIVE = (
    ",time_stats.send_recv.min,time_stats.send_recv.max,time_stats.send_recv.mean,"
    "time_stats.send_recv.median,time_stats.send_recv.std,"
    "rank,num_workers,size,collective,devices_per_node,max_devices_per_node\n"
    """0,0.01,0.02,0.015,0.017,0.004,0,2,10240,send_recv,1,8
1,0.01,0.02,0.015,0.012,0.004,0,2,2048,send_recv,1,8
2,0.004,0.005,0.0045,0.005,0.001,0,2,2048,send_recv,2,8
"""
)


def test_layers_are_columns_of_seconds_by_token_count() -> None:
    profile = parse_layers_csv(LAYERS)
    assert profile.tensor_parallel == 2
    assert profile.tokens.tolist() == [1, 2]
    assert profile.layer("attn") == pytest.approx([5e-6, 9e-6])
    assert sorted(profile.seconds) == ["attn", "embedding"]
    with pytest.raises(KeyError, match=r"no layer 'lm_head'; profiled: \['attn', 'embedding'\]"):
        profile.layer("lm_head")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            LAYERS.replace("attn,2,0,2", "attn,2,64,2"),
            r"^layers.csv:5: kv_cache must be 0, got 64$",
        ),
        (LAYERS.replace("attn,2,0,2", "attn,2,0,4"), r"^layers.csv: tp_size must be one value"),
        (LAYERS.replace("attn,2,0", "attn,3,0"), "^layers.csv: layer kinds cover different"),
        (
            LAYERS.replace("9000", "fast"),
            r"^layers.csv:5: latency\(ns\) must be a number, got 'fast'$",
        ),
        ("layer_name,input\nattn,1\n", r"^layers.csv: header lacks \['kv_cache', 'tp_size'"),
    ],
)
def test_bad_layers_are_refused_with_the_line(text: str, message: str) -> None:
    with pytest.raises(ProfileFormatError, match=message):
        parse_layers_csv(text)


def test_splitwise_keeps_one_model_and_hardware_in_seconds() -> None:
    profile = parse_splitwise_csv(SPLITWISE, "llama2-70b", "h100-80gb")
    assert len(profile) == 2
    assert profile.tensor_parallel.tolist() == [2, 4]
    assert profile.batch_size.tolist() == [1, 4]
    assert profile.prompt_s == pytest.approx([0.085, 0.4])
    assert profile.token_s == pytest.approx([0.037, 0.04])
    assert profile.select(profile.tensor_parallel == 4).prompt_size.tolist() == [1024]
    with pytest.raises(ProfileFormatError, match="no rows for model 'llama2-7b' on 'h100-80gb'"):
        parse_splitwise_csv(SPLITWISE, "llama2-7b", "h100-80gb")


def test_collectives_are_filtered_and_sorted_by_size() -> None:
    across_nodes = parse_collective_csv(COLLECTIVE, num_workers=2, devices_per_node=1)
    assert across_nodes.size_bytes.tolist() == [2048, 10240]
    assert across_nodes.median_s == pytest.approx([12e-6, 17e-6])
    in_node = parse_collective_csv(COLLECTIVE, num_workers=2, devices_per_node=2)
    assert in_node.median_s == pytest.approx([5e-6])
    with pytest.raises(ProfileFormatError, match="no rows with num_workers=4, devices_per_node=4"):
        parse_collective_csv(COLLECTIVE, num_workers=4, devices_per_node=4)


def test_step_samples_round_trip_through_csv() -> None:
    rows = [
        ("prefill", 2, 300, 100**2 + 200**2, 0, 0.05),
        ("prefill", 2, 300, 100**2 + 200**2, 0, 0.052),
        ("prefill", 1, 1000, 1000**2, 0, 0.12),
        ("decode", 8, 8, 0, 4000, 0.01),
        ("decode", 16, 16, 0, 9000, 0.0125),
    ]
    prefill, decode = parse_step_csv(format_step_csv(rows))
    assert prefill.x.tolist() == [300, 300, 1000]
    assert prefill.w.tolist() == [50_000, 50_000, 1_000_000]
    assert prefill.y.tolist() == [0.05, 0.052, 0.12]
    assert prefill.config[0] == prefill.config[1] != prefill.config[2]  # repeats share an id
    assert decode.x.tolist() == [8, 16] and decode.w.tolist() == [4000, 9000]
    assert np.array_equal(decode.y, [0.01, 0.0125])


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("warmup,1,1,1,0,0.1", r"^steps.csv:3: phase must be 'prefill' or 'decode', got 'warmup'$"),
        ("decode,1,1,0,10,0", r"^steps.csv:3: counts must be >= 0 and time_s > 0$"),
        ("decode,1,1,0,-10,0.1", r"^steps.csv:3: counts must be >= 0 and time_s > 0$"),
    ],
)
def test_bad_step_rows_are_refused(row: str, message: str) -> None:
    text = format_step_csv([("prefill", 1, 10, 100, 0, 0.01)]) + row + "\n"
    with pytest.raises(ProfileFormatError, match=message):
        parse_step_csv(text)


def test_a_step_profile_needs_both_phases() -> None:
    with pytest.raises(ProfileFormatError, match=r"^steps.csv: no decode rows$"):
        parse_step_csv(format_step_csv([("prefill", 1, 10, 100, 0, 0.01)]))
