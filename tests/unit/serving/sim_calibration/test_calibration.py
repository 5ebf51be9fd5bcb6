"""The committed calibration: regenerated identically from the profiles, and reproducing the
profile points within the errors it states.

These tests read the H100 profile CSVs of the shared folder (``shared/profiles``, 4 MB, read
once per module, local and read-only): determinism of the committed table cannot be checked
without them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving.sim import LatencyModel, get_profile, kv_capacity_tokens
from serving.sim.calibrated import committed_calibration
from serving.sim.calibration._render import REPORT_BEGIN, REPORT_END, render_report, render_table
from serving.sim.calibration._splitwise import (
    SPLITWISE_CSV,
    SPLITWISE_EXCLUDED,
    SPLITWISE_MODEL,
    splitwise_samples,
    splitwise_tp,
)
from serving.sim.calibration.fit import LAYER_SOURCES, LayerSource, build_calibration, layer_steps
from serving.sim.calibration.fitting import Samples, held_out
from serving.sim.calibration.profiles import read_layers_csv, read_splitwise_csv
from serving.sim.coefficients import Calibration, FitError, profile_name
from serving.sim.models import get_model
from serving.traces import shared_dir

PROFILES = shared_dir() / "profiles"
ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def fresh() -> Calibration:
    return build_calibration(PROFILES)


def test_the_committed_table_regenerates_byte_for_byte(fresh: Calibration) -> None:
    committed = (ROOT / "serving" / "sim" / "_calibration_table.py").read_text("utf-8")
    assert render_table(fresh) == committed
    assert fresh == committed_calibration()


def test_the_fit_report_in_the_docs_is_current(fresh: Calibration) -> None:
    doc = (ROOT / "docs" / "timing-model.md").read_text("utf-8")
    begin, end = doc.index(REPORT_BEGIN), doc.index(REPORT_END) + len(REPORT_END) + 1
    assert doc[begin:end] == render_report(fresh)


def test_building_twice_gives_equal_tables(fresh: Calibration) -> None:
    assert build_calibration(PROFILES) == fresh


def assert_within(model_s: np.ndarray, samples: Samples, stated: FitError) -> None:
    """The model reproduces the points within the stated MAPE and max error (both splits)."""
    rel = np.abs(model_s - samples.y) / samples.y
    mask = held_out(samples.config)
    slack = 1e-5  # the stated errors are rounded to 5 decimals
    assert rel[~mask].mean() <= stated.mape + slack
    assert rel[~mask].max() <= stated.max_error + slack
    assert rel[mask].mean() <= stated.held_out_mape + slack
    assert rel[mask].max() <= stated.held_out_max_error + slack


@pytest.mark.parametrize("source", LAYER_SOURCES, ids=lambda s: f"{s.model}-tp{s.tensor_parallel}")
def test_llmservingsim_points_are_reproduced_within_the_stated_error(source: LayerSource) -> None:
    model = LatencyModel.for_profile(profile_name("h100", source.model, source.tensor_parallel))
    reduce = None
    if source.tensor_parallel > 1:
        reduce = next(
            a
            for a in committed_calibration().all_reduce
            if a.tensor_parallel == source.tensor_parallel
        )
    layers = read_layers_csv(PROFILES / source.path)
    prefill, decode, _ = layer_steps(layers, get_model(source.model), reduce)
    prefill_s = np.array([model.prefill_s([int(n)]) for n in prefill.x])
    decode_s = model.decode_steps_s(decode.x.astype(np.int64), np.zeros(len(decode.x), np.int64))
    assert_within(prefill_s, prefill, model.profile.prefill_fit)
    assert_within(decode_s, decode, model.profile.decode_fit)
    # The bar docs/timing-model.md states for these profiles.
    assert model.profile.prefill_fit.mape < 0.03 and model.profile.decode_fit.mape < 0.03
    assert model.profile.prefill_fit.held_out_mape < 0.03
    assert model.profile.decode_fit.held_out_mape < 0.03


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_splitwise_points_are_reproduced_within_the_stated_error(tp: int) -> None:
    name, hardware, model_name = SPLITWISE_MODEL
    rows = read_splitwise_csv(PROFILES / SPLITWISE_CSV, name, hardware)
    prefill, decode = splitwise_samples(splitwise_tp(rows, tp))
    model = LatencyModel.for_profile(profile_name("h100", model_name, tp))
    assert_within(
        model.prefill_batches_s(prefill.x.astype(np.int64), prefill.w.astype(np.int64)),
        prefill,
        model.profile.prefill_fit,
    )
    assert_within(
        model.profile.decode.seconds(decode.x, decode.w), decode, model.profile.decode_fit
    )
    assert model.profile.prefill_fit.mape < 0.10 and model.profile.decode_fit.mape < 0.03


def test_the_excluded_configurations_are_named_with_a_reason_and_left_out() -> None:
    assert set(SPLITWISE_EXCLUDED) == {(2, 64)}
    assert "preempted" in SPLITWISE_EXCLUDED[(2, 64)]
    name, hardware, _ = SPLITWISE_MODEL
    rows = read_splitwise_csv(PROFILES / SPLITWISE_CSV, name, hardware)
    assert 64 in rows.select(rows.tensor_parallel == 2).batch_size
    assert 64 not in splitwise_tp(rows, 2).batch_size
    assert 64 in splitwise_tp(rows, 4).batch_size


def test_llama31_70b_on_one_gpu_is_not_a_profile_because_it_does_not_fit() -> None:
    assert kv_capacity_tokens(get_model("llama-3.1-70b"), 1) == 0
    with pytest.raises(KeyError):
        get_profile("h100-llama3.1-70b")
    assert all(
        kv_capacity_tokens(get_model(p.model), p.tensor_parallel) > 0
        for p in committed_calibration().profiles
    )
