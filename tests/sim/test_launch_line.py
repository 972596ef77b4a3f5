"""backend.launch_line_grid (sim.launch_line): decode graph launches priced by a robust monotone
line in the graph size; a slow-host grid row cannot make a knot; off, every price is as before."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import SimConfig
from sim.launch_line import LAUNCH_REGIME, fit_launch_line, load_launch_line, with_launch_line
from sim.piecewise import PiecewiseLinearFit
from sim.profiled import ProfiledCostModel
from tests.sim.test_host_speed import priced_run
from tests.sim.test_profiled import GRAPH, grid_plans
from tests.sim.test_profiled_overlap import overlapping_profile

SIZES = (1, 2, 4, 8, 16, 32, 48, 64)


def launch_grid(intercept: float, slope: float, noise: list[float], slow: tuple[int, float] | None = None,
                repeats: int = 3) -> pd.DataFrame:
    """Decode graph rows, `repeats` a size, launch_s = intercept + slope x size (x 1 + noise); with
    slow = (i, factor), one row of size SIZES[i] taken on a host `factor` times slower."""
    rows = []
    for i, size in enumerate(SIZES):
        for r in range(repeats):
            launch = (intercept + slope * size) * (1 + noise[(i * repeats + r) % len(noise)])
            if slow is not None and slow[0] == i and r == 0:
                launch *= slow[1]
            rows.append({"num_prefill_tokens": 0, "num_decode_tokens": size, "num_tokens": size, "num_seqs": size,
                         "cuda_graph": 1, "graph_batch_size": size, "decode_context_tokens": 128 * size,
                         "prefill_context_tokens": 0,
                         "launch_s": launch})
    return pd.DataFrame(rows)


noises = st.lists(st.floats(-0.02, 0.02), min_size=1, max_size=24)


@settings(max_examples=40, deadline=None)
@given(st.floats(3e-4, 2e-3), st.floats(0, 2e-5), noises, st.integers(0, len(SIZES) - 1), st.floats(2.0, 4.0))
def test_a_slow_grid_row_does_not_raise_the_price_at_its_size(intercept, slope, noise, at, factor):
    clean = fit_launch_line(launch_grid(intercept, slope, noise))
    slowed = fit_launch_line(launch_grid(intercept, slope, noise, slow=(at, factor)))
    size = SIZES[at]
    true = intercept + slope * size
    # the median of a size's three rows ignores the slow one: within the grid's noise of the truth
    assert slowed.price(size) <= true * 1.05 + 1e-9
    assert slowed.price(size) == pytest.approx(clean.price(size), rel=0.05)
    # where the per-size least-squares fit (relative error) takes the slow row into its knot
    grid = launch_grid(intercept, slope, [0.0], slow=(at, factor))
    knots = PiecewiseLinearFit.fit(grid["graph_batch_size"].to_numpy(), {}, grid["launch_s"].to_numpy(),
                                   "graph_batch_size", 40, 1)
    assert knots.predict({"graph_batch_size": size}) > true * 1.05


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1e-4, 5e-3), min_size=len(SIZES) * 2, max_size=len(SIZES) * 2))
def test_the_line_is_monotone_in_the_graph_size(launches):
    grid = launch_grid(1.0, 0.0, [0.0], repeats=2).assign(launch_s=launches)
    line = fit_launch_line(grid)
    assert line.slope_s >= 0
    prices = [line.price(s) for s in range(1, 513)]
    assert all(b >= a for a, b in zip(prices, prices[1:]))


def test_a_flat_or_falling_grid_prices_one_launch():
    grid = launch_grid(1e-3, -1e-6, [0.0])
    line = fit_launch_line(grid)
    assert line.slope_s == 0.0
    assert line.price(1) == line.price(512)


@pytest.fixture(scope="module")
def model():
    return ProfiledCostModel.fit(overlapping_profile(), GRAPH)


def test_only_the_decode_graph_launch_fit_changes(model):
    line = fit_launch_line(launch_grid(5e-4, 1e-5, [0.0]))
    moved = with_launch_line(model, line)
    assert {k: v for k, v in moved.fits.items() if k != LAUNCH_REGIME} == \
           {k: v for k, v in model.fits.items() if k != LAUNCH_REGIME}
    for size in SIZES:
        features = {"graph_batch_size": float(size), "num_prefill_tokens": 0.0, "cuda_graph": 1.0,
                    "decode_context_tokens": 1e5, "decode_repeated_tokens": 0.0, "num_seeded": 0.0}
        assert moved.overlap_parts(features)[0] == pytest.approx(line.price(size))


def test_a_model_without_launch_fits_is_refused():
    bare = ProfiledCostModel({k: v for k, v in ProfiledCostModel.fit(overlapping_profile(), GRAPH).fits.items()
                              if not k.startswith("launch:")}, GRAPH)
    with pytest.raises(ValueError, match="launch_line_grid"):
        with_launch_line(bare, fit_launch_line(launch_grid(5e-4, 1e-5, [0.0])))


def test_a_grid_without_launches_is_refused(tmp_path):
    path = tmp_path / "grid.csv"
    launch_grid(5e-4, 1e-5, [0.0]).drop(columns="launch_s").to_csv(path, index=False)
    with pytest.raises(ValueError, match="launch_s"):
        load_launch_line(path)
    with pytest.raises(ValueError, match="not a readable CSV"):
        load_launch_line(tmp_path / "missing.csv")


def test_the_setting_needs_the_profiled_model():
    with pytest.raises(ValueError, match="launch_line_grid"):
        SimConfig(cost_model="roofline", launch_line_grid="grid.csv")


def test_off_the_cost_model_is_the_profiles_and_on_changes_only_the_launch_fit(tmp_path):
    from sim.cost_model import make_cost_model
    from tests.sim.helpers import hardware
    from tests.sim.helpers import model as model_spec

    profile = tmp_path / "profile.csv"
    overlapping_profile().to_csv(profile, index=False)
    grid = tmp_path / "grid.csv"
    launch_grid(5e-4, 1e-5, [0.0]).to_csv(grid, index=False)
    base = SimConfig(cost_model="profiled", profile_path=str(profile), decode_programs=False)
    assert base.launch_line_grid is None
    spec, gpu = model_spec("qwen3-0.6b"), hardware("h100")
    off = make_cost_model(spec, gpu, base, GRAPH)
    on = make_cost_model(spec, gpu, dataclasses.replace(base, launch_line_grid=str(grid)), GRAPH)
    assert isinstance(off, ProfiledCostModel) and isinstance(on, ProfiledCostModel)
    assert on.fits[LAUNCH_REGIME] == with_launch_line(off, load_launch_line(grid)).fits[LAUNCH_REGIME]
    assert {k: v for k, v in on.fits.items() if k != LAUNCH_REGIME} == \
           {k: v for k, v in off.fits.items() if k != LAUNCH_REGIME}
    plans = list(grid_plans())
    assert priced_run(off, plans) == priced_run(make_cost_model(spec, gpu, base, GRAPH), plans)
    assert np.isfinite(priced_run(on, plans)).all()


def test_the_benchmarks_host_is_measured_against_the_line_it_prices():
    from pathlib import Path

    from experiments.serve import host

    grid = Path("experiments/fidelity/code_completion_h200_r2/qwen3-0.6b/profile.csv.gz").resolve()
    sim = ["backend=sim", "backend.cost_model=profiled", "model=qwen3-0.6b", "hardware=h200"]
    fit = host.profile_model(sim)
    line = host.profile_model([*sim, f"backend.launch_line_grid={grid}"])
    assert fit is not None and line is not None
    assert line.fits[LAUNCH_REGIME] == with_launch_line(fit, load_launch_line(grid)).fits[LAUNCH_REGIME]
