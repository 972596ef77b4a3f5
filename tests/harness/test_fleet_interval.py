"""Prediction intervals of simulated fleets (harness.fidelity.fleet_interval): an aggregated fleet's
replicas share a pool's run factor, a disaggregated fleet's two pools draw theirs apart; the point
prediction is the run without an interval; a truth priced dearer on one pool falls inside the
interval when the spread allows it and outside when there is none. Also the settings that reach
no interval are refused rather than ignored."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from harness.config import build_run_config
from harness.convert import ConfigError
from harness.fidelity.fleet_interval import fleet_with_interval
from harness.fleet.config import build_fleet
from harness.fleet.disagg import run_disagg_once
from harness.fleet.disagg_config import build_disagg, pool_run_configs
from harness.output.summary import RunSummary
from harness.study import run_study
from sim import configured_cost_model
from sim.interval import IntervalConfig, PerturbedCostModel, pool_run_factors
from tests.harness.conftest import compose_config

LOADED = ["workload=poisson", "workload.rate=40", "workload.num_requests=80", "workload.prompt_len.low=400",
          "workload.prompt_len.high=1200", "workload.output_len.low=40", "workload.output_len.high=120",
          "output.plots=false"]
INTERVAL = "interval={level: 0.9, draws: %d, machine_spread: %s, seed: 0}"
LATENCIES = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
FLEETS = {"aggregated": ["fleet.replicas=2"],
          "disaggregated": ["fleet=disaggregated", "fleet.prefill_replicas=1", "fleet.decode_replicas=2"]}


@pytest.mark.parametrize("fleet", list(FLEETS))
def test_a_fleets_interval_brackets_the_point_which_is_the_run_without_one(fleet, tmp_path, capsys):
    plain, banded = tmp_path / "plain", tmp_path / "banded"
    run_study(compose_config([*LOADED, *FLEETS[fleet]]), plain)
    assert "% interval (s)" not in capsys.readouterr().out
    run_study(compose_config([*LOADED, *FLEETS[fleet], INTERVAL % (5, "0.05")]), banded)
    assert "90% interval (s): TTFT P50 [" in capsys.readouterr().out
    without, within = pd.read_csv(plain / "summary.csv").iloc[0], pd.read_csv(banded / "summary.csv").iloc[0]
    for column in without.index.drop("wall_s"):
        assert str(within[column]) == str(without[column]), column  # the interval leaves the prediction alone
    for metric in LATENCIES:
        assert within[f"{metric}_lo"] < within[metric] < within[f"{metric}_hi"], metric
    assert within["interval_draws"] == 5 and within["interval_machine_spread"] == 0.05


def test_each_pool_draws_one_run_factor_per_stratum_and_the_pools_pair_at_random():
    factors = pool_run_factors([(), ()], IntervalConfig(draws=10, machine_spread=0.05), np.random.default_rng(3))
    assert factors.shape == (2, 10)
    edges = 0.95 + 0.1 * np.arange(11) / 10
    for pool in factors:
        ordered = np.sort(pool)
        assert np.all(ordered >= edges[:-1] - 1e-3) and np.all(ordered <= edges[1:] + 1e-3)
    assert not np.array_equal(np.argsort(factors[0]), np.argsort(factors[1]))


def test_a_draw_prices_one_pools_replicas_alike_and_the_two_pools_apart():
    rc = build_run_config(compose_config([*LOADED, *FLEETS["disaggregated"]]))
    pools = pool_run_configs(rc, build_disagg(compose_config([*LOADED, *FLEETS["disaggregated"]])))
    seen: list[tuple[float, ...]] = []

    @dataclasses.dataclass
    class Outcome:
        summary: RunSummary

    def run(pricing, label):
        if pricing is not None:
            models = [pricing(0, pools[0]), pricing(1, pools[1]), pricing(1, pools[1])]
            assert all(isinstance(m, PerturbedCostModel) for m in models)
            assert models[1].inner is not models[2].inner  # cost models keep state: one each
            seen.append(tuple(m.run_factor for m in models))
        return Outcome(run_summary)

    run_summary = run_disagg_once(rc, build_disagg(compose_config([*LOADED, *FLEETS["disaggregated"]])),
                                  build_fleet(compose_config(LOADED), with_fleet=False)[1], False).summary
    fleet_with_interval(rc, IntervalConfig(draws=6, machine_spread=0.05), pools, run)
    prefill, decode, decode_again = map(np.array, zip(*seen))
    assert len(seen) == 6 and np.array_equal(decode, decode_again)
    assert not np.allclose(prefill, decode)
    assert np.all(np.abs(np.concatenate([prefill, decode]) - 1) <= 0.05)


def _decode_dearer(rc, fleet, router, factor: float):
    """The 'engine': the disaggregated fleet with every decode step `factor` times the model's price."""
    def pricing(pool, replica):
        model = configured_cost_model(replica.model, replica.hardware, replica.sim, replica.cache, replica.scheduler)
        return PerturbedCostModel(model, (), factor if pool == 1 else 1.0, np.random.default_rng(0))
    return run_disagg_once(rc, fleet, router, False, pricing=pricing).summary


@pytest.mark.parametrize("spread, holds", [(0.08, True), (0.0, False)])
def test_a_truth_with_dearer_decode_steps_is_inside_only_an_interval_that_spreads(spread, holds, tmp_path):
    cfg = compose_config([*LOADED, *FLEETS["disaggregated"], "workload.rate=60"])
    rc, fleet, router = build_run_config(cfg), build_disagg(cfg), build_fleet(cfg, with_fleet=False)[1]
    truth = _decode_dearer(rc, fleet, router, 1.06)
    run_study(compose_config([*LOADED, *FLEETS["disaggregated"], "workload.rate=60", INTERVAL % (9, spread)]),
              tmp_path)
    predicted = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    for metric in ("tpot_p50_s", "tpot_p90_s"):
        inside = predicted[f"{metric}_lo"] <= truth[metric] <= predicted[f"{metric}_hi"]
        assert inside == holds, (metric, predicted[f"{metric}_lo"], truth[metric], predicted[f"{metric}_hi"])


def test_an_interval_point_prices_the_kv_cache_dtype_as_the_plain_run_does(tmp_path):
    fp8 = ["cache.kv_cache_dtype=fp8", "hardware=h100", "workload.num_requests=30", "output.plots=false"]
    run_study(compose_config(fp8), tmp_path / "plain")
    run_study(compose_config([*fp8, INTERVAL % (2, "0.05")]), tmp_path / "banded")
    plain, banded = (pd.read_csv(tmp_path / d / "summary.csv").iloc[0] for d in ("plain", "banded"))
    assert banded["tpot_p50_s"] == plain["tpot_p50_s"] and banded["makespan_s"] == plain["makespan_s"]


@pytest.mark.parametrize("overrides, named", [
    (["study.kind=sweep", "study.param=workload.rate", "study.values=[5,10]", "workload=poisson"], "not sweep"),
    (["experiment=compare"], "compare.interval"),
    (["fleet=disaggregated", "fleet.decode.autoscale={policy: queue}", "workload=poisson"], "autoscaled"),
    (["fleet.replicas=2", "backend=engine"], "backend=sim"),
])
def test_an_interval_no_study_computes_is_refused_in_one_line(overrides, named, tmp_path):
    with pytest.raises(ConfigError, match=named) as error:
        run_study(compose_config([*overrides, INTERVAL % (2, "null")]), tmp_path)
    assert "\n" not in str(error.value)
    assert not any(tmp_path.iterdir())

