"""``goodput bench`` without the engine extra: one clear error that names it."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from serving.bench.cli import BenchError, BenchOptions, run_bench


@pytest.mark.parametrize("module", ["transformers", "tqdm"])
def test_a_missing_module_stops_the_bench_naming_the_extra(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    with pytest.raises(BenchError) as caught:
        run_bench(BenchOptions(url="http://127.0.0.1:9"))
    message = str(caught.value)
    assert f"goodput bench needs {module} (" in message
    assert "'.[vllm-cpu]'" in message and "'.[vllm-gpu]'" in message


def test_the_cli_prints_it_and_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    from goodput.cli import app

    monkeypatch.setitem(sys.modules, "tqdm", None)
    result = CliRunner().invoke(app, ["bench", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "needs tqdm (the progress bar)" in result.output
