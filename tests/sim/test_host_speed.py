"""The serving host's speed (sim.host_speed): the launches carried to a slower or faster host CPU,
measured from a run's decode graph launches; the lead and device-bound steps keep their price."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import SimConfig
from sim.features import step_features
from sim.host_draws import host_draw
from sim.host_speed import (
    measured_host_jitter,
    measured_host_scale,
    with_host_jitter,
    with_host_scale,
    with_part_scales,
)
from sim.profiled import ProfiledCostModel
from tests.sim.helpers import decode_batch, plan, prefill
from tests.sim.test_profiled import GRAPH, grid_plans, true_time
from tests.sim.test_profiled_overlap import (
    LAUNCH_DECODE,
    LAUNCH_PREFILL,
    LEAD_PREFILL,
    at_step,
    lead_model,  # noqa: F401 (a fixture)
    overlapping_profile,
)


@pytest.fixture(scope="module")
def model():
    return ProfiledCostModel.fit(overlapping_profile(), GRAPH)


def priced_run(model, plans):
    """step_time() of plans run in order, a fresh run (step 0 first)."""
    model.drained()
    return [model.step_time(at_step(p, i)) for i, p in enumerate(plans)]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(range(len(grid_plans()))), min_size=1, max_size=12))
def test_the_profiles_own_host_prices_every_step_as_before(model, picks):
    plans = [grid_plans()[i] for i in picks]
    same = with_host_scale(model, 1.0)
    assert priced_run(same, plans) == priced_run(model, plans)


def test_a_launch_bound_eager_prefill_follows_the_host(model):
    small = plan(prefill(300))
    assert true_time(step_features(small, GRAPH)) < LAUNCH_PREFILL  # launch-bound
    for scale in (0.5, 1.5, 2.0):
        alone = with_host_scale(model, scale).step_time(at_step(small, 0))
        assert alone == pytest.approx(scale * LAUNCH_PREFILL, rel=0.03)


def test_a_device_bound_prefill_keeps_its_price(model):
    big = plan(prefill(16384))
    gpu = true_time(step_features(big, GRAPH))
    assert gpu > 1.5 * LAUNCH_PREFILL
    base = model.step_time(at_step(big, 0))
    assert with_host_scale(model, 1.5).step_time(at_step(big, 0)) == pytest.approx(base, rel=1e-9)


def test_a_slower_host_leaves_the_lead_at_the_profiles_price(lead_model):  # noqa: F811 (the fixture)
    # a device-bound prefill after an idle gap waits gpu + lead: the launches follow the host, the
    # lead does not (sim.host_speed: measured on two serving hosts)
    big = plan(prefill(16384))
    gpu = true_time(step_features(big, GRAPH))
    assert gpu > 1.5 * LAUNCH_PREFILL  # device-bound on either host
    for scale in (0.5, 1.5):
        assert with_host_scale(lead_model, scale).step_time(at_step(big, 0)) == pytest.approx(gpu + LEAD_PREFILL,
                                                                                              rel=0.02)
        jittered = with_host_jitter(with_host_scale(lead_model, scale), 0.5, seed=3)
        assert [jittered.step_time(at_step(big, 0)) for _ in range(5)] == \
            pytest.approx([gpu + LEAD_PREFILL] * 5, rel=0.02)


def test_part_scales_price_each_part_by_its_own_factor(lead_model):  # noqa: F811 (the fixture)
    big, small = plan(prefill(16384)), plan(prefill(300))
    gpu = true_time(step_features(big, GRAPH))
    leads = with_part_scales(lead_model, {"lead": 2.0})
    assert leads.step_time(at_step(big, 0)) == pytest.approx(gpu + 2 * LEAD_PREFILL, rel=0.02)
    eager = with_part_scales(lead_model, {"launch:prefill": 3.0, "launch": 1.5})  # a regime's own before the part's
    assert eager.step_time(at_step(small, 0)) == pytest.approx(3 * LAUNCH_PREFILL, rel=0.03)
    assert eager.host_scale == 1.5  # its decode graph launches' factor
    same = with_host_scale(lead_model, 1.7)
    by_parts = with_part_scales(lead_model, {"launch": 1.7, "host": 1.7, "launch_delay": 1.7})
    assert same.fits == by_parts.fits and same.host_scale == by_parts.host_scale == 1.7
    with pytest.raises(ValueError, match="unknown host parts.*gpu"):
        with_part_scales(lead_model, {"gpu": 2.0})
    with pytest.raises(ValueError, match="scales\\['lead'\\] must be a number > 0"):
        with_part_scales(lead_model, {"lead": 0.0})


def test_a_decode_graph_cannot_outrun_a_slower_hosts_launches(model):
    decode = decode_batch([128])
    gpu = true_time(step_features(decode, GRAPH))
    assert LAUNCH_DECODE < gpu < 2 * LAUNCH_DECODE  # device-bound on the profile's host only
    base = priced_run(model, [decode] * 4)
    slow = priced_run(with_host_scale(model, 2.0), [decode] * 4)
    assert base[-1] == pytest.approx(gpu, rel=0.03)
    assert slow[-1] == pytest.approx(2 * LAUNCH_DECODE, rel=0.03)  # back to back: the host's period
    big = decode_batch([4096] * 256)  # device-bound on either host
    assert priced_run(with_host_scale(model, 2.0), [big] * 3)[-1] == pytest.approx(priced_run(model, [big] * 3)[-1])


@pytest.mark.parametrize("scale", [0.7, 1.0, 1.6])
def test_the_host_scale_is_read_off_a_runs_decode_graph_launches(model, scale):
    rows = []
    for p in grid_plans():
        f = step_features(p, GRAPH)
        launch = LAUNCH_PREFILL if f["num_prefill_tokens"] else LAUNCH_DECODE
        # prefill launches kept at the profile's: only decode graph steps measure the host
        rows.append({**f, "launch_s": launch * (1.0 if f["num_prefill_tokens"] else scale)})
    assert measured_host_scale(pd.DataFrame(rows), model) == pytest.approx(scale, rel=0.03)


def test_a_table_without_launches_or_decode_graphs_is_refused_in_one_line(model):
    rows = pd.DataFrame([step_features(p, GRAPH) for p in grid_plans()])
    with pytest.raises(ValueError, match="launch_s"):
        measured_host_scale(rows, model)
    prefills = rows[rows["num_prefill_tokens"] > 0].assign(launch_s=0.01)
    with pytest.raises(ValueError, match="decode_graph"):
        measured_host_scale(prefills, model)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), True, "fast"])
def test_simconfig_refuses_a_host_scale_that_is_not_a_positive_number(bad):
    with pytest.raises(ValueError, match="SimConfig.host_scale"):
        SimConfig(host_scale=bad)


def test_a_simulated_run_on_a_slower_host_takes_longer_where_launches_bound_it():
    from harness.run import run_once
    from harness.scripting import compose_run_config

    # prompts of 4.5-7k tokens: eager prefills, whose ~15 ms of launches exceed their device work
    rc = compose_run_config(["backend=sim", "backend.cost_model=profiled", "model=qwen3-0.6b", "hardware=h100",
                             "backend.profile_path=experiments/fidelity/h100_leakfree/profile_model.csv",
                             "scheduler.max_model_len=8192", "workload.num_requests=40", "workload.arrival=poisson",
                             "workload.rate=5", "workload.prompt_len.low=4500", "workload.prompt_len.high=7000",
                             "workload.output_len.low=10", "workload.output_len.high=30"])
    base = run_once(rc, False).summary
    slower = run_once(dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, host_scale=2.0)), False).summary
    assert float(slower["ttft_p50_s"]) > float(base["ttft_p50_s"])
    same = run_once(dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, host_scale=1.0)), False).summary
    assert float(same["ttft_p50_s"]) == float(base["ttft_p50_s"])


def test_host_draws_are_lognormal_and_depend_on_seed_and_step_alone():
    logs = np.log([host_draw(7, step, 0.25) for step in range(20000)])
    assert abs(logs.mean()) < 0.01 and logs.std() == pytest.approx(0.25, rel=0.03)
    assert host_draw(7, 123, 0.25) == host_draw(7, 123, 0.25) != host_draw(8, 123, 0.25)
    assert host_draw(7, 123, 0.0) == 1.0


def test_a_jittered_host_moves_launch_bound_steps_only_and_reproducibly(model):
    small, big = plan(prefill(300)), plan(prefill(16384))
    jittered = with_host_jitter(model, 0.3, seed=1)
    prices = [jittered.step_time(at_step(small, i)) for i in range(1, 200)]
    logs = np.log(np.array(prices) / np.median(prices))
    assert 0.2 < logs.std() < 0.4
    again = with_host_jitter(model, 0.3, seed=1)
    assert prices == [again.step_time(at_step(small, i)) for i in range(1, 200)]
    base = model.step_time(at_step(big, 0))
    assert with_host_jitter(model, 0.1, seed=1).step_time(at_step(big, 0)) == pytest.approx(base, rel=1e-9)


def test_the_jitter_is_read_off_the_decode_graph_launches(model):
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(40):
        for p in grid_plans():
            f = step_features(p, GRAPH)
            launch = LAUNCH_PREFILL if f["num_prefill_tokens"] else LAUNCH_DECODE
            rows.append({**f, "launch_s": launch * 1.4 * float(np.exp(rng.normal(0.0, 0.25)))})
    table = pd.DataFrame(rows)
    assert measured_host_scale(table, model) == pytest.approx(1.4, rel=0.05)
    assert measured_host_jitter(table, model) == pytest.approx(0.25, rel=0.1)


@pytest.mark.parametrize("bad", [-0.1, 2.5, True, "much"])
def test_simconfig_refuses_a_host_jitter_out_of_range(bad):
    with pytest.raises(ValueError, match="SimConfig.host_jitter"):
        SimConfig(host_jitter=bad)


def test_fast_forward_prices_a_jittered_host_as_step_by_step():
    from harness.run import run_once
    from harness.scripting import compose_run_config

    rc = compose_run_config(["backend=sim", "backend.cost_model=profiled", "model=qwen3-0.6b", "hardware=h100",
                             "backend.profile_path=experiments/fidelity/h100_leakfree/profile_model.csv",
                             "backend.host_scale=1.5", "backend.host_jitter=0.25", "workload.num_requests=60"])
    fast = run_once(rc, False)
    slow = run_once(dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, fast_forward=False)), False)
    assert fast.requests.equals(slow.requests)
    assert fast.summary.metrics() == slow.summary.metrics()
