"""The KV folder on real files laid out as vLLM's ExampleConnector writes them.

Marked ``integration``: these tests write small files under ``tmp_path``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from serving.workers import KVFolder, KVFolderPolicy, expected_layer_files

from .test_kv_folder import safetensors_bytes

pytestmark = pytest.mark.integration

LAYERS = ("model.layers.0.self_attn.attn.safetensors", "model.layers.1.self_attn.attn.safetensors")
NOW = 2_000_000_000.0


def write_prompt(root: Path, name: str, layers: dict[str, bytes], age_s: float = 0.0) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    for layer, data in layers.items():
        (folder / layer).write_bytes(data)
    age(folder, age_s)
    return folder


def age(folder: Path, age_s: float) -> None:
    stamp = NOW - age_s
    for path in [*folder.iterdir(), folder]:
        os.utime(path, (stamp, stamp))


def whole(shape: tuple[int, ...] = (128, 4, 128)) -> dict[str, bytes]:
    return dict.fromkeys(LAYERS, safetensors_bytes(shape))


@pytest.fixture
def kv(tmp_path: Path) -> KVFolder:
    return KVFolder(tmp_path, LAYERS, clock=lambda: NOW)


def test_completeness_of_prompt_folders(kv: KVFolder) -> None:
    write_prompt(kv.root, "a" * 32, whole())
    write_prompt(kv.root, "b" * 32, {LAYERS[0]: safetensors_bytes()})
    truncated = whole()
    truncated[LAYERS[1]] = truncated[LAYERS[1]][:-10]
    write_prompt(kv.root, "c" * 32, truncated)
    write_prompt(
        kv.root,
        "d" * 32,
        {LAYERS[0]: safetensors_bytes(), LAYERS[1]: safetensors_bytes((256, 4, 128))},
    )
    (kv.root / "notes").mkdir()  # not a prompt folder: ignored

    found = {f.name[0]: f for f in kv.scan()}

    assert sorted(found) == ["a", "b", "c", "d"]
    assert found["a"].complete and found["a"].num_bytes == 2 * len(safetensors_bytes())
    assert found["b"].reason == f"missing layer files ['{LAYERS[1]}']"
    assert found["c"].reason.startswith(f"{LAYERS[1]}: file has ")
    assert found["d"].reason.startswith("layers differ in shape")
    assert not any(f.complete for k, f in found.items() if k != "a")


def test_staging_folders_are_incomplete_by_definition(kv: KVFolder) -> None:
    write_prompt(kv.root / ".staging", "a" * 32 + ".123.0", whole())

    (staged,) = kv.scan()

    assert staged.staging and not staged.complete and staged.reason == "staging folder"


def test_remove_incomplete_spares_folders_still_being_written(kv: KVFolder) -> None:
    write_prompt(kv.root, "a" * 32, whole(), age_s=100)
    write_prompt(kv.root, "b" * 32, {LAYERS[0]: safetensors_bytes()}, age_s=100)
    write_prompt(kv.root, "c" * 32, {LAYERS[0]: safetensors_bytes()}, age_s=0.2)
    write_prompt(kv.root / ".staging", "d" * 32 + ".7.0", whole(), age_s=100)

    result = kv.remove_incomplete(grace_s=1.0)

    assert (result.num_removed, result.num_removed_incomplete) == (2, 2)
    assert sorted(p.name[0] for p in kv.root.iterdir() if not p.name.startswith(".")) == ["a", "c"]
    assert list((kv.root / ".staging").iterdir()) == []
    assert result.num_kept == 2


def test_collect_applies_the_policy_and_empties_the_trash(kv: KVFolder) -> None:
    size = 2 * len(safetensors_bytes())
    write_prompt(kv.root, "a" * 32, whole(), age_s=700)  # past max age
    write_prompt(kv.root, "b" * 32, whole(), age_s=300)  # least recently used: evicted for size
    write_prompt(kv.root, "c" * 32, whole(), age_s=200)
    write_prompt(kv.root, "e" * 32, whole(), age_s=5)  # too young to evict
    (kv.root / ".trash" / "leftover").mkdir(parents=True)
    policy = KVFolderPolicy(max_age_s=600, max_bytes=2 * size, min_age_s=30, incomplete_grace_s=10)

    result = kv.collect(policy)

    assert sorted(p.name[0] for p in kv.root.iterdir() if not p.name.startswith(".")) == ["c", "e"]
    assert (result.num_removed, result.bytes_removed) == (2, 2 * size)
    assert (result.num_kept, result.bytes_kept) == (2, 2 * size)
    assert list((kv.root / ".trash").iterdir()) == []


def test_removing_a_folder_twice_frees_nothing_the_second_time(kv: KVFolder) -> None:
    write_prompt(kv.root, "a" * 32, whole())
    status = kv.check("a" * 32)

    assert kv.remove(status) == status.num_bytes
    assert kv.remove(status) == 0
    assert not (kv.root / ("a" * 32)).exists()


def test_expected_layers_come_from_the_model_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))

    assert expected_layer_files(tmp_path) == frozenset(LAYERS)
    assert KVFolder.for_model(tmp_path / "kv", tmp_path).expected_layers == frozenset(LAYERS)
    assert KVFolder(tmp_path / "missing").scan() == []
