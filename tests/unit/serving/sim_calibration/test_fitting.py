"""Least-squares fitting of step curves: recovery of known curves, hold-out, monotonicity,
and the fit of a measured step-sample profile."""

from __future__ import annotations

import numpy as np
import pytest

from serving.sim.calibration.fit import MeasuredSource, fit_measured
from serving.sim.calibration.fitting import (
    FitFailedError,
    Samples,
    fit_curve,
    fit_error,
    fit_shared_attention,
    held_out,
    significant,
)
from serving.sim.calibration.profiles import format_step_csv, parse_step_csv
from serving.sim.coefficients import StepCurve

TRUE = StepCurve(
    base_s=0.008, per_unit_s=2e-5, knee=300, per_unit_above_knee_s=1e-5, per_attention_unit_s=2e-9
)


def curve_samples(curve: StepCurve, x: np.ndarray, w: np.ndarray) -> Samples:
    return Samples.of(x, w, curve.seconds(x.astype(float), w.astype(float)))


def test_a_noise_free_hinge_is_recovered_exactly() -> None:
    x = np.arange(1, 2049)
    curve, error = fit_curve(curve_samples(TRUE, x, x**2), max_knees=2048)
    assert curve == TRUE
    assert error.mape < 1e-6 and error.held_out_max_error < 1e-6
    assert error.num_points + error.num_held_out == 2048


def test_a_fixed_attention_coefficient_is_kept_and_the_rest_fitted() -> None:
    x = np.arange(1, 513)
    w = (x * 37) % 1000  # context varies independently of the batch size
    curve, _ = fit_curve(curve_samples(TRUE, x, w), attention_s=2e-9, max_knees=512)
    assert curve == TRUE
    with pytest.raises(FitFailedError):
        # A wrong fixed coefficient that makes the rest fall with x cannot be fitted.
        fit_curve(curve_samples(TRUE, x, x * 1000), attention_s=1e-6, max_knees=0)


def test_without_knees_the_fit_is_a_straight_line() -> None:
    curve, _ = fit_curve(Samples.of([1, 2, 3], [0, 0, 0], [1.0, 1.5, 2.0]), max_knees=0)
    assert (curve.base_s, curve.per_unit_s, curve.knee) == (0.5, 0.5, 0)
    assert curve.per_unit_above_knee_s == 0.0


def test_points_that_fall_with_work_cannot_be_fitted() -> None:
    samples = Samples.of([1, 2, 3, 4], [0, 0, 0, 0], [4.0, 3.0, 2.0, 1.0])
    with pytest.raises(FitFailedError, match=r"^no monotone fit through 4 points"):
        fit_curve(samples, attention_s=0.0)


def test_every_fifth_configuration_from_the_third_is_held_out() -> None:
    config = np.array([10, 10, 11, 12, 13, 14, 15, 16, 17, 12])
    mask = held_out(config)
    # Sorted ids 10..17 rank 0..7: ranks 2 and 7 (ids 12, 17) are held out, with repeats.
    assert np.flatnonzero(mask).tolist() == [3, 8, 9]
    assert not held_out(np.array([1, 2, 3, 4])).any()  # under five configurations


def test_fit_error_is_relative_and_split_by_the_mask() -> None:
    model = np.array([1.1, 2.0, 2.7, 4.0])
    measured = np.array([1.0, 2.0, 3.0, 4.0])
    error = fit_error(model, measured, np.array([False, False, True, False]))
    assert error.num_points == 3 and error.num_held_out == 1
    assert error.mape == pytest.approx(0.1 / 3, abs=1e-5)
    assert error.max_error == pytest.approx(0.1)
    assert error.held_out_mape == error.held_out_max_error == pytest.approx(0.1)


def test_a_shared_bandwidth_is_recovered_across_groups() -> None:
    bandwidth = 2.5e12
    groups = []
    for per_token_bytes, base in ((163_840.0, 0.037), (81_920.0, 0.029), (40_960.0, 0.030)):
        batch = np.repeat(np.array([1, 2, 4, 8, 16, 32]), 3)
        context = batch * np.tile(np.array([500, 2000, 8000]), 6)
        time_s = base + 3e-4 * batch + per_token_bytes * context / bandwidth
        groups.append((Samples.of(batch, context, time_s), per_token_bytes))
    fitted, curves, error = fit_shared_attention(groups)
    assert fitted == pytest.approx(bandwidth, rel=1e-5)
    assert [c.base_s for c in curves] == pytest.approx([0.037, 0.029, 0.030])
    assert error.max_error < 1e-5


def test_samples_reject_inconsistent_columns() -> None:
    with pytest.raises(ValueError, match=r"^x has 2 rows, y has 3$"):
        Samples(np.zeros(2), np.zeros(3), np.ones(3), np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"^y must be > 0 seconds, got min 0.0$"):
        Samples.of([1], [0], [0.0])
    with pytest.raises(ValueError, match=r"^samples must hold at least one point$"):
        Samples.of([], [], [])
    with pytest.raises(ValueError, match=r"^x and w must be >= 0$"):
        Samples.of([-1], [0], [1.0])


def test_significant_rounds_to_six_digits() -> None:
    assert significant(0.001234567891) == 0.00123457
    assert significant(123456789.0) == 123457000.0


def test_a_measured_profile_fits_both_curves_with_the_context_term() -> None:
    prefill_curve = StepCurve(0.01, 1e-4, 128, 5e-5, 1e-8)
    decode_curve = StepCurve(0.02, 1e-3, 0, 0.0, 4e-7)
    rows: list[tuple[str, int, int, int, int, float]] = []
    for n in (16, 32, 64, 128, 256, 512, 1024):
        time_s = float(prefill_curve.seconds(np.array(n), np.array(n * n)))
        rows.append(("prefill", 1, n, n * n, 0, time_s))
    for b in (1, 2, 4, 8):
        for per_seq in (100, 400, 1600):
            time_s = float(decode_curve.seconds(np.array(b), np.array(b * per_seq)))
            rows.append(("decode", b, b, 0, b * per_seq, time_s))
    prefill, decode = parse_step_csv(format_step_csv(rows))
    fit = fit_measured(MeasuredSource("cpu", "llama-3.1-8b", 1, "cpu/steps.csv"), prefill, decode)
    assert fit.name == "cpu-llama3.1-8b" and fit.source == "measured cpu/steps.csv"
    assert (fit.prefill, fit.decode) == (prefill_curve, decode_curve)
    assert fit.prefill_fit.max_error < 1e-5 and fit.decode_fit.max_error < 1e-5
