"""KV sizing (the seed article's table), KV capacity, KV transfer times, model shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from serving.sim.kv import (
    H100_MEMORY_BYTES,
    NIC_LINE_RATE_BYTES_PER_S,
    get_link,
    kv_bytes,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_capacity_tokens,
    kv_transfer_s,
)
from serving.sim.models import MODELS, ModelShape, get_model

GIB = 2**30
GB = 1e9


def test_kv_table_of_the_seed_article_is_in_gib() -> None:
    # The article: an 8k-token prompt at batch 1 holds 1.0 GB of KV for Llama-3.1-8B and
    # 3.94 GB for Llama-3.1-405B. Its "GB" are GiB (2**30 B): in decimal GB the same bytes
    # read 1.07 GB and 4.23 GB, which the table does not show.
    small = kv_bytes(get_model("llama-3.1-8b"), 8192, batch_size=1)
    large = kv_bytes(get_model("llama-3.1-405b"), 8192, batch_size=1)
    assert small == 2 * 32 * 8 * 128 * 2 * 8192
    assert round(small / GIB, 2) == 1.00
    assert round(large / GIB, 2) == 3.94
    assert (round(small / GB, 2), round(large / GB, 2)) == (1.07, 4.23)


def test_bytes_per_token_is_k_and_v_over_layers_heads_and_dims() -> None:
    assert kv_bytes_per_token(get_model("llama-3.1-8b")) == 131_072
    assert kv_bytes_per_token(get_model("llama-3.1-70b")) == 327_680
    assert kv_bytes_per_token(get_model("llama-3.1-405b")) == 516_096
    # Llama-2-7B has no grouped-query attention: four times 3.1-8B's 8 KV heads.
    assert kv_bytes_per_token(get_model("llama-2-7b")) == 4 * 131_072
    assert kv_bytes_per_token(get_model("llama-3.1-8b"), bytes_per_element=1) == 65_536


def test_kv_bytes_scale_with_tokens_and_batch() -> None:
    shape = get_model("llama-3.1-70b")
    assert kv_bytes(shape, 1000, batch_size=3) == 3 * kv_bytes(shape, 1000)
    assert kv_bytes(shape, 0) == 0
    with pytest.raises(ValueError, match=r"^num_tokens must be >= 0, got -1$"):
        kv_bytes(shape, -1)
    with pytest.raises(ValueError, match=r"^batch_size must be >= 0, got -2$"):
        kv_bytes(shape, 1, batch_size=-2)


def test_tensor_parallel_shards_kv_heads_and_replicates_past_them() -> None:
    shape = get_model("llama-3.1-70b")  # 8 KV heads
    whole = kv_bytes_per_token(shape)
    assert [kv_bytes_per_token_per_gpu(shape, tp) for tp in (1, 2, 4, 8)] == [
        whole,
        whole // 2,
        whole // 4,
        whole // 8,
    ]
    assert kv_bytes_per_token_per_gpu(shape, 16) == whole // 8  # one head per GPU, replicated
    with pytest.raises(ValueError, match=r"must divide or be a multiple of llama-3\.1-70b's 8 KV"):
        kv_bytes_per_token_per_gpu(shape, 3)
    with pytest.raises(ValueError, match=r"^tensor_parallel must be >= 1, got 0$"):
        kv_bytes_per_token_per_gpu(shape, 0)


def test_capacity_is_what_the_weights_leave_at_the_memory_utilization() -> None:
    shape = get_model("llama-3.1-8b")
    tokens = kv_capacity_tokens(shape, 1, memory_utilization=0.9)
    free = 0.9 * H100_MEMORY_BYTES - shape.weight_bytes()
    assert tokens * 131_072 <= free < (tokens + 1) * 131_072
    # Two GPUs: half the weights each and half the KV bytes per token each.
    assert kv_capacity_tokens(shape, 2) > 2 * tokens


def test_capacity_is_zero_when_the_weights_do_not_fit() -> None:
    # Llama-3.1-70B in BF16 is 141 GB: not on one 80 GB H100, which is why its tp1 profile
    # is not fitted.
    assert get_model("llama-3.1-70b").weight_bytes() > H100_MEMORY_BYTES
    assert kv_capacity_tokens(get_model("llama-3.1-70b"), 1) == 0
    assert kv_capacity_tokens(get_model("llama-3.1-70b"), 2) > 0
    with pytest.raises(ValueError, match=r"^memory_utilization must be in \(0, 1\], got 1.5$"):
        kv_capacity_tokens(get_model("llama-3.1-8b"), 1, memory_utilization=1.5)


def test_transfer_is_setup_plus_bytes_over_bandwidth() -> None:
    link = get_link("rdma-400g")
    size = kv_bytes(get_model("llama-3.1-8b"), 8192)
    assert kv_transfer_s(size, link) == pytest.approx(link.setup_s + size / link.bytes_per_s)
    assert kv_transfer_s(size, "rdma-400g") == kv_transfer_s(size, link)
    assert kv_transfer_s(0, link) == link.setup_s


def test_parallel_streams_split_the_bytes_and_pay_the_setup_once() -> None:
    link = get_link("rdma-400g")
    size = 4e9
    one, eight = kv_transfer_s(size, link), kv_transfer_s(size, link, num_streams=8)
    assert isinstance(one, float) and isinstance(eight, float)
    assert eight - link.setup_s == pytest.approx((one - link.setup_s) / 8)
    with pytest.raises(ValueError, match=r"^num_streams must be >= 1, got 0$"):
        kv_transfer_s(size, link, num_streams=0)


def test_transfer_is_vectorised_and_grows_with_bytes() -> None:
    sizes = np.array([0.0, 1e6, 1e8, 1e9])
    times = kv_transfer_s(sizes, "nvlink")
    assert isinstance(times, np.ndarray)
    assert np.all(np.diff(times) > 0)
    with pytest.raises(ValueError, match=r"^num_bytes must be >= 0, got min -1.0$"):
        kv_transfer_s(np.array([1.0, -1.0]), "nvlink")


def test_fitted_links_respect_the_hardware() -> None:
    nvlink, rdma = get_link("nvlink"), get_link("rdma-400g")
    # Below the line rates: NVLink 4 moves 450 GB/s per direction per H100, a NIC 50 GB/s.
    assert 0 < nvlink.bytes_per_s < 450e9
    assert 0 < rdma.bytes_per_s < NIC_LINE_RATE_BYTES_PER_S
    assert nvlink.setup_s > 0 and rdma.setup_s > 0
    size = kv_bytes(get_model("llama-3.1-405b"), 8192)
    assert kv_transfer_s(size, nvlink) < kv_transfer_s(size, rdma)


def test_unknown_link_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="unknown link 'pcie'; known links: nvlink, rdma-400g"):
        get_link("pcie")


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("llama-3.1-8b", 8.03),
        ("llama-3.1-70b", 70.55),
        ("llama-3.1-405b", 405.85),
        ("llama-2-7b", 6.74),
        ("llama-2-70b", 68.98),
    ],
)
def test_parameter_counts_match_the_published_sizes(name: str, billions: float) -> None:
    assert math.isclose(get_model(name).num_params / 1e9, billions, rel_tol=2e-3)


def test_shapes_are_validated_and_looked_up_by_name() -> None:
    assert set(MODELS) == {
        "llama-3.1-8b",
        "llama-3.1-70b",
        "llama-3.1-405b",
        "llama-2-7b",
        "llama-2-70b",
        "tiny-llama",  # the local CPU test model (cpu-tiny-llama profile)
    }
    with pytest.raises(ValueError, match=r"^bad: num_layers must be >= 1, got 0$"):
        ModelShape("bad", 0, 4096, 32, 8, 128, 14336, 128256)
    with pytest.raises(ValueError, match=r"num_attention_heads \(32\) must be a multiple"):
        ModelShape("bad", 32, 4096, 32, 6, 128, 14336, 128256)
    with pytest.raises(KeyError, match="unknown model 'gpt-2'; known models: llama-2-70b"):
        get_model("gpt-2")
