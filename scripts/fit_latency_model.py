"""Fit the timing-model engine's coefficients to the H100 profiles and write them out.

Reads ``shared/profiles`` (``$GOODPUT_SHARED_DIR/profiles``, or ``--profiles``), fits every
curve (``serving/sim/calibration/fit.py``), and writes:

* ``serving/sim/_calibration_table.py`` — the committed coefficient table;
* the fit-report block of ``docs/timing-model.md`` (between its ``fit-report`` markers).

Deterministic: the same profiles give the same bytes. ``--check`` writes nothing and exits 1
when either file is out of date. Run from the repo root::

    .venv/bin/python scripts/fit_latency_model.py [--profiles DIR] [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from serving.sim.calibration._render import render_report, render_table, replace_report  # noqa: E402
from serving.sim.calibration.fit import build_calibration  # noqa: E402
from serving.traces import shared_dir  # noqa: E402

TABLE = ROOT / "serving" / "sim" / "_calibration_table.py"
DOC = ROOT / "docs" / "timing-model.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--profiles", type=Path, default=shared_dir() / "profiles")
    parser.add_argument("--check", action="store_true", help="fail if the outputs are stale")
    args = parser.parse_args(argv)

    calibration = build_calibration(args.profiles)
    outputs = {
        TABLE: render_table(calibration),
        DOC: replace_report(DOC.read_text(encoding="utf-8"), render_report(calibration)),
    }
    stale = [p for p, text in outputs.items() if not p.exists() or p.read_text("utf-8") != text]
    if args.check:
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)}", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    for profile in calibration.profiles:
        print(
            f"{profile.name:24} prefill MAPE {100 * profile.prefill_fit.mape:5.2f} % "
            f"(held out {100 * profile.prefill_fit.held_out_mape:5.2f} %)  "
            f"decode MAPE {100 * profile.decode_fit.mape:5.2f} % "
            f"(held out {100 * profile.decode_fit.held_out_mape:5.2f} %)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
