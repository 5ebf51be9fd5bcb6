"""The committed calibration table (``_calibration_table.py``, written by
``scripts/fit_latency_model.py``), read on first use rather than with the package, so that
the script that writes the table still runs when the table is missing or was written for
older types."""

from __future__ import annotations

from serving.sim.coefficients import Calibration

__all__ = ["committed_calibration"]


def committed_calibration() -> Calibration:
    """The committed table."""
    from serving.sim._calibration_table import CALIBRATION

    return CALIBRATION
