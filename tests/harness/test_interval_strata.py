"""The interval's stratified run factors and its quantile estimator (sim.interval): one run factor
in each stratum of its distribution, the quantile function of a product of two uniforms, and
interval ends that move less with the seed than independent draws' min..max."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.interval as interval
from sim.interval import IntervalConfig, interval_columns, perturbed_models, run_factor_quantiles, stratified_uniforms

spreads = st.floats(0.0, 0.3)


@given(st.integers(2, 60), st.integers(0, 2**32 - 1))
def test_stratified_uniforms_put_one_in_each_stratum(n, seed):
    u = np.sort(stratified_uniforms(n, np.random.default_rng(seed)))
    assert np.all(u >= np.arange(n) / n) and np.all(u < (np.arange(n) + 1) / n)


@settings(max_examples=30, deadline=None)
@given(spreads, spreads, st.integers(0, 2**32 - 1))
def test_run_factor_quantiles_are_the_products_distribution(machine, bias, seed):
    u = np.linspace(0.02, 0.98, 25)
    q = run_factor_quantiles(u, machine, bias)
    assert np.all(np.diff(q) >= 0)
    assert np.all(q >= (1 - machine) * (1 - bias) - 1e-12) and np.all(q <= (1 + machine) * (1 + bias) + 1e-12)
    rng = np.random.default_rng(seed)
    sample = rng.uniform(1 - machine, 1 + machine, 40_000) * rng.uniform(1 - bias, 1 + bias, 40_000)
    if max(machine, bias) > 1e-3:  # continuous: the sample's CDF at each quantile is its level
        # within the Dvoretzky-Kiefer-Wolfowitz band, which holds at all 25 levels at once but for
        # a 1e-6 chance: a bound per level (4 s.e.) was crossed by one of 25 in a CI run
        band = np.sqrt(np.log(2 / 1e-6) / (2 * len(sample)))
        assert np.all(np.abs(np.searchsorted(np.sort(sample), q) / len(sample) - u) < band)


def test_the_quantile_grid_is_fine_enough(monkeypatch):
    u = np.linspace(0.001, 0.999, 200)
    coarse = run_factor_quantiles(u, 0.074, 0.019)
    monkeypatch.setattr(interval, "_FACTOR_GRID", 8 * interval._FACTOR_GRID)
    assert np.abs(run_factor_quantiles(u, 0.074, 0.019) - coarse).max() < 1e-4


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 40), st.floats(0.0, 0.1), st.integers(0, 2**32 - 1))
def test_each_draws_run_factor_sits_in_its_own_stratum(draws, bias, seed):
    residuals = np.full(5, -bias)
    config = IntervalConfig(draws=draws, machine_spread=0.04, seed=seed)
    factors = np.sort([m.run_factor for m in perturbed_models(lambda: None, residuals, config)])
    edges = run_factor_quantiles(np.arange(draws + 1) / draws, 0.04, bias)
    assert np.all(factors >= edges[:-1] - 1e-12) and np.all(factors <= edges[1:] + 1e-12)


@given(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=50), st.floats(0.01, 10.0), st.floats(0.5, 0.99))
def test_interval_ends_lie_within_the_draws_and_hold_the_point(values, point, level):
    out = interval_columns({"m": point}, [{"m": v} for v in values], level, ("m",))
    assert out["m_lo"] <= point <= out["m_hi"]
    assert out["m_lo"] >= min(min(values), point) and out["m_hi"] <= max(max(values), point)


def test_hazen_positions_put_19_draws_ends_between_the_two_outermost():
    out = interval_columns({"m": 10.0}, [{"m": float(v)} for v in range(1, 20)], 0.9, ("m",))
    assert out["m_lo"] == pytest.approx(1.45) and out["m_hi"] == pytest.approx(18.55)


def _upper_ends(stratified: bool, draws: int, seeds: int = 400) -> np.ndarray:
    """The 90% interval's upper end of a metric that is ln(run factor) plus a little per-run noise
    (the per-step scatter, averaged over a run), over seeds: stratified draws with Hazen's
    quantile, or independent draws' k-th largest (the distribution-free prediction interval)."""
    ends = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        u = stratified_uniforms(draws, rng) if stratified else rng.uniform(size=draws)
        values = np.log(run_factor_quantiles(u, 0.04, 0.019)) + rng.normal(0.0, 0.003, draws)
        if stratified:
            ends.append(interval_columns({"m": 0.0}, [{"m": v} for v in values], 0.9, ("m",))["m_hi"])
        else:
            k = max(1, int((draws + 1) * 0.05 + 1e-9))
            ends.append(np.sort(values)[draws - k])
    return np.array(ends)


def test_stratified_ends_move_with_the_seed_less_than_independent_draws():
    """19 stratified draws place the 95% quantile of the 8B's run factor (+-4% machine, +-1.9% bias)
    more steadily than 99 independent ones, and on the same quantile (within 0.1 point of ln)."""
    stratified, independent = _upper_ends(True, 19), _upper_ends(False, 99)
    assert stratified.std() < independent.std()
    assert abs(np.median(stratified) - np.median(independent)) < 1e-3
