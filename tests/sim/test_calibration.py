"""Host time in the profiled model: fitted from real steps' host_s, added to step_time, saved and loaded."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from sim.features import step_features
from sim.profiled import ProfiledCostModel
from sim.profiled_validation import relative_errors
from tests.sim.helpers import decode_batch, plan, prefill
from tests.sim.test_profiled import GRAPH, profile, true_time


def true_host(f) -> float:
    return 2e-4 + 1.5e-6 * f["num_seqs"] + 4e-9 * f["num_prefill_tokens"]


def real_steps(noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Steps as a recorded engine run has them: features, host_s, no duration_s of the grid."""
    rng = np.random.default_rng(seed)
    rows = []
    for batch in range(1, 400, 7):
        f = step_features(decode_batch([500 + i for i in range(batch)]), GRAPH)
        rows.append({**f, "host_s": true_host(f) * (1 + noise * rng.standard_normal())})
    for tokens in (100, 1000, 5000, 16384):
        for seqs in (1, 8, 30):
            f = step_features(plan(*(prefill(tokens // seqs, rid=str(i)) for i in range(seqs))), GRAPH)
            rows.append({**f, "host_s": true_host(f) * (1 + noise * rng.standard_normal())})
    return pd.DataFrame(rows).assign(duration_s=np.nan)


def test_host_time_is_fitted_from_host_rows_and_added_to_step_time():
    model = ProfiledCostModel.fit(pd.concat([profile(), real_steps()], ignore_index=True), GRAPH)
    assert model.has_host
    for step in (decode_batch([800] * 37), plan(prefill(3000, 0, rid="a"), prefill(500, 100, rid="b"))):
        f = step_features(step, GRAPH)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            total = model.step_time(step)
        assert model.host_time(f) == pytest.approx(true_host(f), rel=1e-6)
        assert total == pytest.approx(true_time(f) + true_host(f), rel=1e-6)


def test_host_rows_do_not_disturb_the_executor_fit_or_its_errors():
    alone = ProfiledCostModel.fit(profile(noise=0.01), GRAPH)
    both = ProfiledCostModel.fit(pd.concat([profile(noise=0.01), real_steps(noise=0.05)], ignore_index=True), GRAPH)
    measured = profile(noise=0.01, seed=7)
    # predict() stays comparable with duration_s (the executor's part); include_host adds the rest
    assert np.allclose(both.predict(measured), alone.predict(measured), rtol=1e-12)
    hosts = np.array([true_host(r) for r in measured.to_dict("records")])
    assert np.allclose(both.predict(measured, include_host=True) - both.predict(measured), hosts, rtol=0.1)
    assert np.allclose(relative_errors(both, measured), relative_errors(alone, measured), rtol=1e-12)


def test_host_fit_is_unbiased_in_the_mean_under_noise():
    # the clock sums host times: their mean matters, not the relative error of each
    noisy = real_steps(noise=0.5, seed=3)
    model = ProfiledCostModel.fit(pd.concat([profile(), noisy], ignore_index=True), GRAPH)
    predicted = sum(model.host_time(r) for r in noisy.to_dict("records"))
    assert predicted == pytest.approx(noisy["host_s"].sum(), rel=0.02)


def test_host_fit_round_trips_through_saved_coefficients(tmp_path):
    model = ProfiledCostModel.fit(pd.concat([profile(noise=0.01), real_steps(noise=0.1)], ignore_index=True), GRAPH)
    model.to_csv(tmp_path / "model.csv")
    loaded = ProfiledCostModel.load(tmp_path / "model.csv", GRAPH)
    assert loaded.has_host
    steps = [decode_batch([300] * 5), decode_batch([2000] * 200), plan(prefill(4000, 1000))]
    assert [loaded.step_time(s) for s in steps] == pytest.approx([model.step_time(s) for s in steps], rel=1e-12)


def test_without_host_rows_step_time_is_the_executor_time():
    model = ProfiledCostModel.fit(profile(), GRAPH)
    step = decode_batch([700] * 20)
    assert not model.has_host
    assert model.host_time(step_features(step, GRAPH)) == 0.0
    assert model.step_time(step) == pytest.approx(true_time(step_features(step, GRAPH)), rel=1e-6)


def test_host_time_outside_its_range_warns():
    model = ProfiledCostModel.fit(pd.concat([profile(), real_steps()], ignore_index=True), GRAPH)
    with pytest.warns(UserWarning, match="host time of a step with num_seqs=500"):
        model.host_time(step_features(decode_batch([100] * 500), GRAPH))
