"""experiments/fidelity/coverage_misses.py: which classes of a group fall outside their conformalised
interval, whether the engine's own repeats could reach it, and the counterfactual of widening each
interval by its cell's repeat range."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.fidelity.coverage_misses import misses, nearest_repeat, noise_counterfactual, outside_cells, spreads
from harness.fidelity.report import engine_spread


def test_coverage_misses_name_the_classes_outside_and_skip_groups_with_too_few_cells():
    def cell(workload: str, engine: float, load: str) -> dict:
        return {"model": "m", "hardware": "h", "workload": workload, "load": load, "metric": "ttft_p50_s",
                "engine": engine, "sim": 1.0, "sim_lo": 0.9, "sim_hi": 1.1}

    rows = [cell("odd", 1.5, "0.5")] + [cell(f"c{i}", 1.0, "0.5") for i in range(10)]
    rows += [cell(f"c{i}", 2.0, "0.8") for i in range(3)]  # too few: no claim, so no miss listed
    table = pd.DataFrame(rows)
    found = misses(table).reset_index()
    assert list(found["workload"]) == ["odd"] and list(found["load"]) == ["0.5"]
    assert spreads(table).loc[("m", "h", "0.8"), "classes"] == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=10))
def test_the_nearest_repeat_bound_holds_the_repeats_and_is_exact_for_two(values):
    mean = float(np.mean(values))
    cell = [pd.Series([v]) for v in (mean, engine_spread(np.array(values)), len(values))]
    lowest, highest = (float(nearest_repeat(*cell, pd.Series([above])).iloc[0]) for above in (True, False))
    assert lowest <= min(values) * (1 + 1e-9) and highest >= max(values) * (1 - 1e-9)
    if len(values) == 2:
        assert lowest == pytest.approx(min(values)) and highest == pytest.approx(max(values))


def _group(odd_engine: float, odd_spread: float) -> pd.DataFrame:
    """Ten classes inside [0.9, 1.1] (margin 0 for an eleventh) and class "odd" above it."""
    def cell(workload: str, engine: float, spread: float) -> dict:
        return {"model": "m", "hardware": "h", "workload": workload, "load": "0.5", "metric": "ttft_p50_s",
                "engine": engine, "sim": 1.0, "err": 1.0 / engine - 1, "sim_lo": 0.9, "sim_hi": 1.1,
                "engine_spread": spread,
                "engine_repeats": 2}

    return pd.DataFrame([cell("odd", odd_engine, odd_spread)] + [cell(f"c{i}", 1.0, 0.01) for i in range(10)])


def test_an_outside_cell_says_whether_its_nearest_repeat_could_lie_inside():
    noisy = outside_cells(_group(1.2, 0.2)).iloc[0]  # repeats 1.08 and 1.32: the lower one inside
    steady = outside_cells(_group(1.2, 0.02)).iloc[0]  # repeats 1.188 and 1.212: both above 1.1
    assert noisy["beyond_pct"] == pytest.approx(100 * (1.2 / 1.1 - 1))
    assert noisy["nearest_repeat_beyond_pct"] == pytest.approx(100 * (1.08 / 1.1 - 1))
    assert steady["nearest_repeat_beyond_pct"] == pytest.approx(100 * (1.188 / 1.1 - 1))
    assert len(outside_cells(_group(1.05, 0.2))) == 0


def test_the_noise_counterfactual_takes_in_only_a_miss_its_own_repeats_reach():
    noisy = noise_counterfactual(_group(1.2, 0.2), 1.0).iloc[0]  # ln(1.2 / 1.1) = 0.087 < 0.2
    steady = noise_counterfactual(_group(1.2, 0.02), 1.0).iloc[0]
    assert noisy["inside"] == 10 and noisy["inside_noise_x1"] == 11
    assert steady["inside_noise_x1"] == 10
    assert noisy["width_p50_noise_x1"] == pytest.approx(math.log(1.1 / 0.9) + 2 * 0.01)
    unchanged = noise_counterfactual(_group(1.2, 0.2), 0.0).iloc[0]
    assert unchanged["inside_noise_x0"] == unchanged["inside"]
    with pytest.raises(ValueError, match="--noise"):
        noise_counterfactual(_group(1.2, 0.2), -0.5)
