"""``goodput model build-tiny``: deterministic, cached, no download."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from goodput.cli import app
from serving.model import MANIFEST_NAME, TinyModelSpec, build_tiny_model

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def digests(directory: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build by the real command line, in its own process."""
    target = tmp_path_factory.mktemp("model") / "tiny"
    done = subprocess.run(
        [sys.executable, "-m", "goodput", "model", "build-tiny", str(target), "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(target.resolve())
    return target


def test_same_seed_same_bytes_other_seed_other_weights(built: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", TinyModelSpec(seed=0))
    other = build_tiny_model(tmp_path / "other", TinyModelSpec(seed=1))

    assert digests(again) == digests(built)
    assert {"config.json", "model.safetensors", "tokenizer.json", MANIFEST_NAME} <= set(
        digests(built)
    )
    changed = {name for name, digest in digests(other).items() if digests(built)[name] != digest}
    assert changed == {"model.safetensors", MANIFEST_NAME}


def test_a_complete_build_is_reused_a_damaged_one_rebuilt(built: Path) -> None:
    weights = built / "model.safetensors"
    reference = digests(built)
    before = weights.stat().st_mtime_ns

    build_tiny_model(built, TinyModelSpec(seed=0))
    assert weights.stat().st_mtime_ns == before  # found complete: not written again

    (built / "tokenizer.json").write_text("{}")  # its size no longer matches the manifest
    build_tiny_model(built, TinyModelSpec(seed=0))
    assert weights.stat().st_mtime_ns != before
    assert digests(built) == reference


def test_a_foreign_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")

    result = CliRunner().invoke(app, ["model", "build-tiny", str(tmp_path)])

    assert result.exit_code == 2
    assert f"error: {tmp_path} exists and is not a tiny-model build" in result.output
    assert (tmp_path / "mine.txt").read_text() == "keep me"
