"""``goodput sim``: invalid input exits 2 with the reason; a run writes its report and plots."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from goodput.cli import app
from serving.sim.cli import SimCommandError, run_sim


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "prefill=1"], "error: prefill/decode: a PD cluster needs >= 1 instance"),
        (["--slo", "ttft"], "error: slo: expected metric=seconds, got 'ttft'"),
        (["--slo-target", "1.5"], "error: slo-target must be in (0, 1), got 1.5"),
        (["--policy", "nope"], "error: policy: expected 'none' or 'package.module:attribute'"),
    ],
)
def test_invalid_input_exits_2_naming_it(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["sim", "--trace", "no-such.jsonl", *args])
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.integration
def test_a_run_prints_the_summary_and_writes_report_and_plots(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    rows = [f"2023-11-16 18:15:{s:02d}.0000000,{600 + 40 * s},{20 + s}" for s in range(0, 40, 2)]
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    out = io.StringIO()
    report = run_sim(
        trace=str(trace),
        cluster="prefill=1,decode=2,model=llama3.1-8b",
        rate_scale=4.0,
        duration_s=20.0,
        seed=3,
        out=tmp_path / "run",
        stream=out,
    )
    text = out.getvalue()
    assert "goodput sim: 40 requests of t over 20 s at 4x" in text
    assert "goodput (req/s)" in text and "TTFT" in text
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert saved == json.loads(json.dumps(report))
    assert saved["simulation"]["requests"] == saved["goodput"]["requests"] == 40
    for name in ("summary.txt", "ttft_cdf.png", "itl_cdf.png", "pools.png"):
        assert (tmp_path / "run" / name).stat().st_size > 0
    with pytest.raises(SimCommandError, match="no request of"):
        run_sim(trace=str(trace), cluster="prefill=1,decode=1", duration_s=0.001, start_s=0.5)
