"""KV folder rules without a file system: layer-file completeness and the GC plan."""

from __future__ import annotations

import json
import struct

import pytest

from serving.workers import KVFolderPolicy, KVFolderStatus, check_safetensors, plan_gc


def safetensors_bytes(shape: tuple[int, ...] = (128, 4, 128), dtype: str = "BF16") -> bytes:
    """A real safetensors layout: 8-byte header length, JSON header, tensor bytes."""
    size = 2 * shape[0] * shape[1] * shape[2]
    header = json.dumps(
        {"kv_cache": {"dtype": dtype, "shape": list(shape), "data_offsets": [0, size]}}
    ).encode()
    return struct.pack("<Q", len(header)) + header + bytes(size)


def test_a_whole_file_is_complete_with_its_signature() -> None:
    data = safetensors_bytes()

    reason, signature = check_safetensors(data[:200], len(data))

    assert reason is None
    assert signature == "kv_cache:BF16[128, 4, 128]"


@pytest.mark.parametrize(
    ("cut", "expected"),
    [
        (lambda d: d[:-1], "file has 131163 bytes, header and tensors need 131164"),
        (lambda d: d[:4], "file of 4 bytes has no header"),
        (lambda d: d[:40], "header length 84 does not fit a file of 40 bytes"),
    ],
)
def test_a_truncated_file_is_incomplete(cut: object, expected: str) -> None:
    data = cut(safetensors_bytes())  # type: ignore[operator]

    reason, signature = check_safetensors(data[:200], len(data))

    assert (reason, signature) == (expected, "")


def test_a_header_that_lies_about_its_tensor_is_incomplete() -> None:
    header = json.dumps({"kv_cache": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}})
    data = struct.pack("<Q", len(header)) + header.encode() + bytes(8)

    reason, _ = check_safetensors(data, len(data))

    assert reason == "tensor 'kv_cache' spans 8 bytes, its shape needs more"


def test_garbage_is_incomplete() -> None:
    data = struct.pack("<Q", 3) + b"{x]"

    assert check_safetensors(data, len(data))[0] == "header is not valid JSON"


def folder(name: str, num_bytes: int, last_used: float, complete: bool = True) -> KVFolderStatus:
    return KVFolderStatus(name, num_bytes, last_used, complete, "" if complete else "partial")


NOW = 10_000.0
POLICY = KVFolderPolicy(max_age_s=600.0, max_bytes=1000, min_age_s=30.0, incomplete_grace_s=10.0)


def test_gc_removes_old_and_abandoned_folders_keeps_young_ones() -> None:
    folders = [
        folder("old", 100, NOW - 601),
        folder("fresh", 100, NOW - 5),
        folder("abandoned", 100, NOW - 11, complete=False),
        folder("writing", 100, NOW - 1, complete=False),
    ]

    removed = plan_gc(folders, POLICY, NOW)

    assert sorted(f.name for f in removed) == ["abandoned", "old"]


def test_gc_evicts_least_recently_used_until_under_the_size_bound() -> None:
    folders = [
        folder("c", 400, NOW - 100),
        folder("a", 400, NOW - 300),
        folder("b", 400, NOW - 200),
        folder("d", 400, NOW - 50),
    ]

    removed = plan_gc(folders, POLICY, NOW)

    assert [f.name for f in removed] == ["a", "b"]  # 1600 bytes → 800, under the bound


def test_gc_never_evicts_a_folder_younger_than_min_age_for_size() -> None:
    folders = [folder("older", 800, NOW - 40), folder("young", 800, NOW - 10)]

    removed = plan_gc(folders, POLICY, NOW)

    assert [f.name for f in removed] == ["older"]
    assert plan_gc([folder("young", 5000, NOW - 10)], POLICY, NOW) == []


def test_young_incomplete_folders_still_count_against_the_size_bound() -> None:
    folders = [folder("done", 600, NOW - 100), folder("writing", 600, NOW - 1, complete=False)]

    removed = plan_gc(folders, POLICY, NOW)

    assert [f.name for f in removed] == ["done"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_age_s": -1.0}, "max_age_s must be >= 0 seconds, got -1.0"),
        ({"max_bytes": -1}, "max_bytes must be >= 0, got -1"),
        ({"min_age_s": 700.0}, "min_age_s (700.0) must not exceed max_age_s (600.0)"),
    ],
)
def test_invalid_policies(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        KVFolderPolicy(**kwargs)  # type: ignore[arg-type]
    assert str(caught.value) == message
