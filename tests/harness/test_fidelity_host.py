"""The held-out protocol's serving-host rows (harness.fidelity.serving_host): each engine run's host
speed read off its recorded decode graph launches, the cell simulated at each and averaged."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from harness.fidelity.serving_host import LABEL, averaged, host_scales, serving_host_rows
from harness.fidelity.steps import expected_experts, with_moe_experts
from harness.fidelity.study import FidelityConfig
from harness.run import run_once
from harness.scripting import compose_run_config
from sim.interval import IntervalConfig
from sim.profiled import ProfiledCostModel

PROFILE = "experiments/fidelity/h100_leakfree/profile_model.csv"
META = {"num_blocks": 2422, "graph_batch_sizes": [], "prefill_graph_sizes": [], "async_scheduling": True}


@pytest.fixture(scope="module")
def served():
    """A simulated run standing in for an engine run: its steps with launches recorded at 1.5x and
    2x the profile's host (only decode graph steps are read)."""
    rc = compose_run_config(["backend=sim", "backend.cost_model=profiled", "model=qwen3-0.6b", "hardware=h100",
                             f"backend.profile_path={PROFILE}", "workload.num_requests=30"])
    model = ProfiledCostModel.load(PROFILE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_once(rc, False, record=True)
        launches = [model.overlap_parts(row)[0] for row in run.steps.to_dict("records")]
    runs = [dataclasses.replace(run, steps=run.steps.assign(launch_s=[f * x for x in launches])) for f in (1.5, 2.0)]
    return rc, runs


def test_each_runs_host_is_read_off_its_launches(served):
    _, runs = served
    measured = host_scales(runs, PROFILE)
    assert [scale for scale, _ in measured] == pytest.approx([1.5, 2.0], rel=1e-6)
    assert [jitter for _, jitter in measured] == pytest.approx([0.0, 0.0], abs=1e-9)  # a constant ratio


def test_runs_without_launches_give_no_row(served):
    rc, runs = served
    bare = [dataclasses.replace(run, steps=run.steps.drop(columns="launch_s")) for run in runs]
    assert host_scales(bare, PROFILE) is None
    assert serving_host_rows(rc, PROFILE, META, bare, IntervalConfig(draws=2)) == {}


def test_the_row_averages_a_simulation_per_repeat(served):
    rc, runs = served
    rows = serving_host_rows(rc, PROFILE, META, runs, IntervalConfig(draws=2))
    row = rows[LABEL]
    assert row["host_scale"] == pytest.approx(1.75, rel=1e-6)
    assert {"ttft_p50_s", "ttft_p50_s_lo", "ttft_p50_s_hi", "tpot_p90_s"} <= set(row)
    alone = [serving_host_rows(rc, PROFILE, META, [run], IntervalConfig(draws=2))[LABEL] for run in runs]
    assert row["ttft_p50_s"] == pytest.approx((alone[0]["ttft_p50_s"] + alone[1]["ttft_p50_s"]) / 2)


def test_averaged_keeps_numbers_only():
    assert averaged([{"a": 1.0, "b": "x", "c": True}, {"a": 3.0, "b": "y", "c": False}]) == {"a": 2.0}


def test_the_setting_is_a_bool():
    with pytest.raises(ValueError, match="fidelity.price_serving_host"):
        FidelityConfig(price_serving_host="yes")


MOE_PROFILE = "experiments/fidelity/h100_30b_r2/qwen3-30b-a3b/profile_model.csv"


def test_an_moe_run_without_per_step_expert_counts_is_read_at_the_expected_count():
    """A served MoE run's steps carry no expert count (the engine reads it back only for the grid),
    while the MoE fit prices a step's launch by it: the host is read with the expected count, as
    the replays price those steps."""
    overrides = ["backend=sim", "backend.cost_model=profiled", "model=qwen3-30b-a3b", "hardware=h100",
                 f"backend.profile_path={MOE_PROFILE}", "workload.num_requests=12"]
    rc = compose_run_config(overrides)
    model = ProfiledCostModel.load(MOE_PROFILE)
    experts = expected_experts(rc, {**META, "moe_routing_skew": 0.379})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_once(rc, False, record=True)
        priced = with_moe_experts(run.steps, experts)
        launches = [model.overlap_parts(row)[0] for row in priced.to_dict("records")]
    assert "moe_distinct_experts" not in run.steps.columns
    runs = [dataclasses.replace(run, steps=run.steps.assign(launch_s=[1.25 * x for x in launches]))]
    with pytest.raises(KeyError):
        host_scales(runs, MOE_PROFILE)  # what the protocol crashed with before it passed the count
    (scale, _), = host_scales(runs, MOE_PROFILE, experts)
    assert scale == pytest.approx(1.25, rel=0.02)
