"""What the stack demo (``goodput demo --engine vllm|sim``, goodput/demo_scenario.py) must
show, read from its output: live lines of both phases, at least one admission action (an
acknowledged policy and a 429 naming the SLO) and one planner move carried through, with
their effect in the closing comparison, and no failed request."""

from __future__ import annotations

import re

ROW = re.compile(r"^\s+(\d+) s\s+(no control|control)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+) \|")
CELLS = re.compile(r"\S+(?: \(critical \d+\))?")


def comparison(lines: list[str]) -> dict[str, list[str]]:
    """The closing table: row label → one cell per phase."""
    start = next(i for i, line in enumerate(lines) if line.startswith("Comparison"))
    table: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.strip() or line.startswith("goodput demo"):
            break
        label, cells = line[:28].strip(), line[28:]
        table[label] = [cells[k : k + 20].strip() for k in range(0, len(cells), 20)]
    return table


def check_loop_output(lines: list[str]) -> dict[str, list[str]]:
    """Assert what the module says; the comparison table."""
    output = "\n".join(lines)
    rows = [m for line in lines if (m := ROW.match(line))]
    assert {m[2] for m in rows} == {"no control", "control"}, output
    assert all(int(m[6]) == 0 for m in rows), output  # failed
    assert any("admission policy v" in line and "acked by demo-gateway" in line
               for line in lines), output  # fmt: skip
    refusal = next(line for line in lines if ">> first 429" in line)
    assert "slo 'demo-loop': predicted" in refusal and "Retry-After" in refusal, output
    assert any(">> move " in line and "decode → prefill" in line and "done:" in line
               for line in lines), output  # fmt: skip
    table = comparison(lines)
    assert table["failed"] == ["0", "0"], output
    assert table["shed (429)"][0] == "0 (critical 0)", output
    assert table["shed (429)"][1].endswith("(critical 0)"), output
    assert int(table["shed (429)"][1].split()[0]) > 0, output
    assert table["planner moves"][0] == "0" and int(table["planner moves"][1]) >= 1, output
    assert "goodput demo: stopped every process it started" in output
    return table
