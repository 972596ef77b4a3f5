"""Overlap pricing of the profiled model (async scheduling): an eager, launch-bound step is partly
hidden behind the step before it; a device-bound one is not; nothing is hidden at a run's start."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from sim.features import step_features
from sim.profiled import ProfiledCostModel
from tests.sim.helpers import decode_batch, plan, prefill
from tests.sim.test_profiled import GRAPH, grid_plans, true_time

LAUNCH_PREFILL = 0.005  # host time to launch an eager prefill: longer than a small one's kernels
LAUNCH_DECODE = 0.001


def overlapping_profile() -> pd.DataFrame:
    rows = []
    for p in grid_plans():
        f = step_features(p, GRAPH)
        gpu = true_time(f)
        launch = LAUNCH_PREFILL if f["num_prefill_tokens"] else LAUNCH_DECODE
        # repeats submitted back to back: a step takes the longer of its launches and its kernels
        rows.append({**f, "duration_s": max(gpu, launch), "launch_s": launch, "gpu_s": gpu})
    return pd.DataFrame(rows)


def at_step(p, step):
    return dataclasses.replace(p, stats=dataclasses.replace(p.stats, step=step))


@pytest.fixture(scope="module")
def model():
    fitted = ProfiledCostModel.fit(overlapping_profile(), GRAPH)
    assert fitted.prices_overlap
    return fitted


def test_a_launch_bound_prefill_hides_behind_the_decode_before_it(model):
    small = plan(prefill(300))
    decode = decode_batch([1000] * 50)
    alone = model.step_time(at_step(small, 0))
    assert alone == pytest.approx(LAUNCH_PREFILL, rel=0.02)
    decode_time = model.step_time(at_step(decode, 1))
    after = model.step_time(at_step(small, 2))
    gpu = true_time(step_features(small, GRAPH))
    free = decode_time - LAUNCH_DECODE  # host time left free while the decode ran
    assert after == pytest.approx(max(gpu, LAUNCH_PREFILL - free), rel=0.02)
    assert gpu < after < alone


def test_a_device_bound_prefill_is_not_shortened(model):
    big = plan(prefill(16384))
    gpu = true_time(step_features(big, GRAPH))
    assert gpu > LAUNCH_PREFILL
    model.step_time(at_step(decode_batch([3000] * 200), 1))
    assert model.step_time(at_step(big, 2)) == pytest.approx(gpu, rel=0.02)


def test_back_to_back_prefills_hide_nothing(model):
    # the host spent the whole previous (launch-bound) step launching it
    small = plan(prefill(300))
    first = model.step_time(at_step(small, 0))
    assert model.step_time(at_step(small, 2)) == pytest.approx(first, rel=0.02)


def test_table_prediction_uses_each_rows_measured_predecessor(model, tmp_path):
    steps = [decode_batch([3000] * 200), plan(prefill(300)), decode_batch([2000] * 100), plan(prefill(500))]
    table = pd.DataFrame([step_features(p, GRAPH) for p in steps])
    measured = np.array([0.012, 0.011, 0.006, 0.016])
    table = table.assign(duration_s=measured, previous_duration_s=np.r_[np.nan, measured[:-1]])
    predicted = model.predict(table)
    for i in (1, 3):
        gpu = true_time(table.iloc[i])
        assert predicted[i] == pytest.approx(max(gpu, LAUNCH_PREFILL - (measured[i - 1] - LAUNCH_DECODE)), rel=0.02)
    alone = model.predict(table.drop(columns=["previous_duration_s"]))
    assert alone[1] == pytest.approx(LAUNCH_PREFILL, rel=0.02) and predicted[1] < alone[1]
    # the overlap fits survive a save and load
    model.to_csv(tmp_path / "coef.csv")
    loaded = ProfiledCostModel.load(tmp_path / "coef.csv", GRAPH)
    assert loaded.prices_overlap and np.allclose(loaded.predict(table), predicted, rtol=1e-9)


def test_the_loop_delay_before_a_launch_is_recovered_from_real_steps():
    from harness.calibration.fit import fit_launch_delay

    model = ProfiledCostModel.fit(overlapping_profile(), GRAPH)
    steps = [decode_batch([1000 + 40 * i] * (20 + 5 * i)) if i % 2 == 0 else plan(prefill(100 + 37 * i))
             for i in range(12)]
    table = pd.DataFrame([step_features(p, GRAPH) for p in steps])
    rows = table.to_dict("records")
    model.launch_delay_s = 0.0015  # what the "engine" had
    measured = []
    for i, row in enumerate(rows):
        alone = model.predict_features(row)
        previous = (measured[-1], model._part("launch", rows[i - 1])) if i else None
        measured.append(model.overlapped(row, alone, previous))
    real = table.assign(duration_s=measured, previous_duration_s=[np.nan] + measured[:-1])
    model.launch_delay_s = 0.0
    assert fit_launch_delay(model, real) == pytest.approx(0.0015)
    # with nothing hidden in the measurements, the fitted delay leaves the host no free time
    no_overlap = real.assign(duration_s=[model.overlapped(r, model.predict_features(r), None) for r in rows])
    no_overlap = no_overlap.assign(previous_duration_s=[np.nan] + list(no_overlap["duration_s"][:-1]))
    model.launch_delay_s = fit_launch_delay(model, no_overlap)
    assert model.launch_delay_s > 0.0015
    assert model.predict(no_overlap) == pytest.approx(no_overlap["duration_s"].to_numpy(), rel=1e-9)


LEAD_PREFILL = 0.003  # host time before the device can run a prefill: building, uploading, launching ahead


@pytest.fixture(scope="module")
def lead_model():
    profile = overlapping_profile()
    lead = np.where(profile["num_prefill_tokens"] > 0, LEAD_PREFILL, 0.0005)
    fitted = ProfiledCostModel.fit(profile.assign(lead_s=lead), GRAPH)
    assert fitted.prices_overlap and "lead:prefill" in fitted.fits
    return fitted


def test_a_device_bound_prefill_after_an_idle_gap_pays_its_lead(lead_model):
    big = plan(prefill(16384))
    gpu = true_time(step_features(big, GRAPH))
    assert lead_model.step_time(at_step(big, 0)) == pytest.approx(gpu + LEAD_PREFILL, rel=0.02)
    lead_model.drained()  # an idle gap mid-run: nothing in flight either
    assert lead_model.step_time(at_step(big, 5)) == pytest.approx(gpu + LEAD_PREFILL, rel=0.02)


def test_the_lead_hides_behind_the_step_before_it_as_far_as_its_free_host_time_goes(lead_model):
    big = plan(prefill(16384))
    gpu = true_time(step_features(big, GRAPH))
    short = decode_batch([100] * 4)  # leaves the host less free time than the lead
    short_time = lead_model.step_time(at_step(short, 1))
    free = short_time - LAUNCH_DECODE
    assert 0 < free < LEAD_PREFILL
    assert lead_model.step_time(at_step(big, 2)) == pytest.approx(gpu + LEAD_PREFILL - free, rel=0.02)
    lead_model.step_time(at_step(decode_batch([3000] * 200), 3))  # free time enough for the whole lead
    assert lead_model.step_time(at_step(big, 4)) == pytest.approx(gpu, rel=0.02)


def test_grid_rows_are_priced_as_measured_behind_a_repeat_of_themselves(lead_model):
    # a device-bound step repeated back to back: the host prepares each repeat while the one
    # before runs, so the lead is hidden (gpu - launch > lead); the grid measured gpu
    big = plan(prefill(16384))
    row = pd.DataFrame([step_features(big, GRAPH)])
    gpu = true_time(row.iloc[0])
    assert gpu - LAUNCH_PREFILL > LEAD_PREFILL
    assert lead_model.predict(row)[0] == pytest.approx(gpu, rel=0.02)


def test_a_profile_without_lead_prices_as_before(model, lead_model):
    # a long prefill after an idle gap, then one behind a launch-bound prefill (which leaves the
    # host no free time): without a lead each is priced max(gpu, launch), with one gpu + lead
    steps = [plan(prefill(16384)), plan(prefill(300)), plan(prefill(8192))]
    for m in (model, lead_model):
        m.drained()
    without = [model.step_time(at_step(s, i)) for i, s in enumerate(steps)]
    with_lead = [lead_model.step_time(at_step(s, i)) for i, s in enumerate(steps)]
    for i in (0, 2):
        gpu = true_time(step_features(steps[i], GRAPH))
        assert without[i] == pytest.approx(max(gpu, LAUNCH_PREFILL), rel=0.02)
        assert with_lead[i] == pytest.approx(max(gpu + LEAD_PREFILL, LAUNCH_PREFILL), rel=0.02)
        assert with_lead[i] > without[i]
