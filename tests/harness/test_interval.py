"""Prediction intervals (sim.interval, harness.fidelity.interval) on a synthetic problem whose
truth is known: the "engine" is the simulator with a cost model = the model's price x one machine
factor x a per-step error drawn from a known distribution; the model's residuals are measured on
a separate calibration sample of that distribution. A 90% interval must hold the truth's P50/P90
in most trials, and collapse (missing most) when told there is no error."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from harness.config import build_run_config
from harness.fidelity.interval import simulate_with_interval
from harness.run import run_once
from sim import build_sim_executor
from sim.interval import DEFAULT_MACHINE_SPREAD, MACHINE_SPREAD, IntervalConfig, PerturbedCostModel
from sim.roofline import RooflineCostModel
from tests.harness.conftest import compose_config

SIGMA = 0.2  # per-step log-normal error of the truth
SPREAD = 0.05  # machine factors uniform in [0.95, 1.05]
METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")


@pytest.fixture(scope="module")
def rc():
    return build_run_config(compose_config([
        "model=qwen3-0.6b", "workload=poisson", "workload.num_requests=30", "workload.rate=150",
        "workload.prompt_len.low=200", "workload.prompt_len.high=1000", "workload.output_len.low=10",
        "workload.output_len.high=60"]))


def _roofline(rc):
    return lambda: RooflineCostModel(rc.model, rc.hardware)


def _truth(rc, seed: int) -> dict:
    rng = np.random.default_rng(1000 + seed)
    # a truth step takes price * factor * e: the model's residual (price - truth) / truth is 1/(factor e) - 1
    noisy = PerturbedCostModel(_roofline(rc)(), 1.0 / rng.lognormal(0.0, SIGMA, 4000) - 1.0,
                               float(rng.uniform(1 - SPREAD, 1 + SPREAD)), rng)
    executor = build_sim_executor(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler, noisy)
    return run_once(rc, False, executor=executor).summary


def _coverage(rc, config: IntervalConfig, residuals, trials: int) -> float:
    hits = []
    for seed in range(trials):
        run = dataclasses.replace(rc, workload=dataclasses.replace(rc.workload, seed=seed))
        seeded = dataclasses.replace(config, seed=seed)
        predicted = simulate_with_interval(run, seeded, _roofline(rc), residuals).summary
        truth = _truth(run, seed)
        hits += [predicted[f"{m}_lo"] <= truth[m] <= predicted[f"{m}_hi"] for m in METRICS]
    return float(np.mean(hits))


def test_90_percent_intervals_hold_the_truth_in_most_trials(rc):
    calibration = np.random.default_rng(7).lognormal(0.0, SIGMA, 300)  # measured / predicted of held-out steps
    residuals = 1.0 / calibration - 1.0
    config = IntervalConfig(level=0.9, draws=19, machine_spread=SPREAD)
    assert _coverage(rc, config, residuals, trials=8) >= 0.8  # nominal 0.9; 32 cells


def test_an_interval_without_error_sources_misses_the_truth(rc):
    assert _coverage(rc, IntervalConfig(level=0.9, draws=2, machine_spread=0.0), (), trials=4) <= 0.5


def test_a_biased_fit_widens_the_interval_on_both_sides_of_the_point(rc):
    """Held-out residuals all near -6% (the fit prices unseen shapes 6% cheap): the interval spans
    the point on both sides by about that bias, since a new workload may sit on either side; the
    per-step scatter alone does not move a run."""
    residuals = -0.06 + np.random.default_rng(3).normal(0.0, 0.01, 200)
    summary = simulate_with_interval(rc, IntervalConfig(draws=19, machine_spread=0.0), _roofline(rc), residuals).summary
    for metric in ("tpot_p50_s", "tpot_p90_s"):
        point, lo, hi = summary[metric], summary[f"{metric}_lo"], summary[f"{metric}_hi"]
        assert lo < 0.98 * point and hi > 1.02 * point
        assert lo > 0.85 * point and hi < 1.15 * point  # bias, amplified a little by queueing


def test_interval_columns_bracket_the_point_prediction(rc):
    summary = simulate_with_interval(rc, IntervalConfig(draws=4, machine_spread=0.1), _roofline(rc), ()).summary
    for metric in METRICS:
        assert summary[f"{metric}_lo"] <= summary[metric] <= summary[f"{metric}_hi"]
        assert summary[f"{metric}_hi"] > summary[f"{metric}_lo"]


@pytest.mark.parametrize("field, value", [("level", 1.0), ("draws", 1), ("machine_spread", -0.1), ("seed", -1)])
def test_bad_interval_settings_are_named(field, value):
    with pytest.raises(ValueError, match=f"interval.{field}"):
        IntervalConfig(**{field: value})


def test_compare_table_says_whether_the_engine_falls_inside():
    import pandas as pd

    from harness.compare.tables import interval_columns

    table = pd.DataFrame({"metric": ["ttft_p50_s", "ttft_p90_s", "output_tok_s"], "engine": [1.0, 2.0, 5.0],
                          "sim_profiled": [1.1, 1.5, 5.0]})
    summary = {"ttft_p50_s_lo": 0.9, "ttft_p50_s_hi": 1.2, "ttft_p90_s_lo": 1.4, "ttft_p90_s_hi": 1.9}
    out = interval_columns(table, {"sim_profiled": summary})
    assert list(out["in_interval_sim_profiled"][:2]) == [True, False]
    assert pd.isna(out["in_interval_sim_profiled"][2])  # no interval for throughput
    assert out["hi_sim_profiled"][1] == 1.9


def test_a_single_simulated_run_writes_its_interval_to_the_summary(tmp_path):
    import pandas as pd

    from harness.study import run_study

    run_study(compose_config(["interval={level: 0.9, draws: 3, machine_spread: null, seed: 0}",
                              "workload.num_requests=12", "output.plots=false"]), tmp_path)
    summary = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    for metric in METRICS:
        assert summary[f"{metric}_lo"] <= summary[metric] <= summary[f"{metric}_hi"]
    assert summary["interval_draws"] == 3
    assert summary["interval_machine_spread"] == MACHINE_SPREAD["qwen3-0.6b"]  # the default model's figure


def test_an_interval_on_the_engine_is_refused(rc):
    from harness.convert import ConfigError

    with pytest.raises(ConfigError, match="backend=sim"):
        simulate_with_interval(dataclasses.replace(rc, backend="engine"), IntervalConfig(draws=2))


def test_each_models_machine_spread_is_half_its_largest_spread_between_machines():
    """MACHINE_SPREAD from the committed measurements (experiments/calibration/engine_repeatability.csv:
    the engine's latency percentiles on several H100 machines): half the largest (max - min) / mean
    of one percentile of one workload."""
    import pandas as pd

    path = Path(__file__).resolve().parents[2] / "experiments" / "calibration" / "engine_repeatability.csv"
    runs = pd.read_csv(path)
    assert set(runs["metric"]) == {"ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms"}
    values = runs.groupby(["model", "workload", "metric"])["value"]
    assert (values.size() >= 2).all()  # a spread needs at least two machines
    spread = (values.max() - values.min()) / values.mean()
    largest = spread.groupby(level="model").max()
    assert set(largest.index) == set(MACHINE_SPREAD)
    for name, value in largest.items():
        assert MACHINE_SPREAD[name] == pytest.approx(value / 2, abs=0.0005), name


def test_the_step_spread_is_the_served_steps_largest_deviation_from_the_fit_rounded_up():
    """DEFAULT_MACHINE_SPREAD from the committed calibration runs (none a held-out cell): served decode
    graph steps against the fit's price, Qwen3-0.6B on three H100s and Qwen3-8B on its fit's own
    machine; the largest deviation, rounded up to the percent."""
    import pandas as pd

    runs = Path(__file__).resolve().parents[2] / "experiments" / "calibration" / "h100_run6"
    small = pd.read_csv(runs / "qwen3_0_6b_repeat" / "replay_decode.csv")["err"]
    validation = pd.read_csv(runs / "qwen3_8b" / "validation.csv")
    large = validation.query("set == 'real_steps' and regime == 'decode_graph'")["sum_rel_error"]
    assert len(small) == 8 and len(large) == 1
    largest = max(float(small.abs().max()), float(large.abs().iloc[0]))
    assert 0.037 < largest <= DEFAULT_MACHINE_SPREAD < largest + 0.01
    assert DEFAULT_MACHINE_SPREAD == math.ceil(largest * 100) / 100


def test_a_config_without_a_machine_spread_takes_its_models_never_below_the_step_spread():
    assert IntervalConfig().for_model("qwen3-0.6b").machine_spread == MACHINE_SPREAD["qwen3-0.6b"]
    assert MACHINE_SPREAD["qwen3-8b"] < DEFAULT_MACHINE_SPREAD  # its two machines agreed closer than steps vary
    assert IntervalConfig().for_model("qwen3-8b").machine_spread == DEFAULT_MACHINE_SPREAD
    assert IntervalConfig().for_model("tiny-qwen3").machine_spread == DEFAULT_MACHINE_SPREAD
    assert IntervalConfig(machine_spread=0.2).for_model("qwen3-8b").machine_spread == 0.2


def test_machine_spread_script_prints_the_floor_from_the_calibration_runs(capsys):
    from experiments.fidelity.machine_spread import main

    assert main([]) == 0  # not pytest's argv
    out = capsys.readouterr().out
    assert f"rounded up to the percent {DEFAULT_MACHINE_SPREAD:.2f}" in out and "leakfree / lead" in out
