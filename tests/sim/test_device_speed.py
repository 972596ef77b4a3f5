"""The serving GPU's speed (sim.device_speed): another GPU of the profile's kind runs the device work
s times as long; launches, leads and host time keep their price, so a launch-bound step keeps its."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import SimConfig
from sim.device_speed import with_device_scale
from sim.features import step_features
from sim.host_speed import with_host_scale
from tests.sim.helpers import decode_batch, plan, prefill
from tests.sim.test_host_speed import model, priced_run  # noqa: F401 (a fixture)
from tests.sim.test_profiled import GRAPH, grid_plans, true_time
from tests.sim.test_profiled_overlap import LAUNCH_PREFILL, LEAD_PREFILL, at_step, lead_model  # noqa: F401


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(range(len(grid_plans()))), min_size=1, max_size=12))
def test_the_profiles_own_gpu_prices_every_step_as_before(model, picks):  # noqa: F811 (the fixture)
    plans = [grid_plans()[i] for i in picks]
    assert priced_run(with_device_scale(model, 1.0), plans) == priced_run(model, plans)


@pytest.mark.parametrize("scale", [0.9, 1.05, 1.3])
def test_device_bound_steps_take_the_gpus_factor(lead_model, scale):  # noqa: F811 (the fixture)
    big = plan(prefill(16384))  # device-bound: its kernels outlast its launches
    gpu = true_time(step_features(big, GRAPH))
    assert gpu > 1.5 * LAUNCH_PREFILL
    # after an idle gap: the device time follows the GPU, the lead (host time) does not
    moved = with_device_scale(lead_model, scale)
    assert moved.step_time(at_step(big, 0)) == pytest.approx(scale * gpu + LEAD_PREFILL, rel=0.02)
    decode = decode_batch([4096] * 256)  # a decode graph, device-bound: its fitted duration
    base = priced_run(lead_model, [decode] * 3)[-1]
    assert priced_run(moved, [decode] * 3)[-1] == pytest.approx(scale * base, rel=1e-9)


def test_a_launch_bound_prefill_keeps_its_price_on_a_faster_gpu(model):  # noqa: F811 (the fixture)
    small = plan(prefill(300))
    assert true_time(step_features(small, GRAPH)) < LAUNCH_PREFILL / 2
    base = model.step_time(at_step(small, 0))
    assert with_device_scale(model, 0.8).step_time(at_step(small, 0)) == pytest.approx(base, rel=1e-9)
    assert with_device_scale(model, 1.5).step_time(at_step(small, 0)) == pytest.approx(base, rel=1e-9)


def test_host_and_device_scales_compose_in_either_order(model):  # noqa: F811 (the fixture)
    plans = [grid_plans()[i] for i in (0, 5, 40, 80, len(grid_plans()) - 1)]
    one = with_device_scale(with_host_scale(model, 1.6), 1.07)
    other = with_host_scale(with_device_scale(model, 1.07), 1.6)
    assert one.device_scale == other.device_scale == pytest.approx(1.07)
    assert priced_run(one, plans) == pytest.approx(priced_run(other, plans), rel=1e-12)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), True, "fast"])
def test_simconfig_refuses_a_device_scale_that_is_not_a_positive_number(bad):
    with pytest.raises(ValueError, match="SimConfig.device_scale"):
        SimConfig(device_scale=bad)


def test_a_device_scale_is_refused_with_the_roofline_not_ignored():
    assert SimConfig(cost_model="roofline").device_scale == 1.0
    with pytest.raises(ValueError, match="device_scale .* needs cost_model=profiled, got 'roofline'"):
        SimConfig(cost_model="roofline", device_scale=1.1)


def test_a_simulated_run_on_a_slower_gpu_takes_longer_and_fast_forward_agrees():
    from harness.run import run_once
    from harness.scripting import compose_run_config

    rc = compose_run_config(["backend=sim", "backend.cost_model=profiled", "model=qwen3-0.6b", "hardware=h100",
                             "backend.profile_path=experiments/fidelity/h100_leakfree/profile_model.csv",
                             "workload.num_requests=60", "workload.arrival=poisson", "workload.rate=20",
                             "workload.prompt_len.low=200", "workload.prompt_len.high=3000",
                             "workload.output_len.low=20", "workload.output_len.high=200"])

    def summary(device_scale: float, fast_forward: bool) -> dict:
        sim = dataclasses.replace(rc.sim, device_scale=device_scale, fast_forward=fast_forward)
        row = dict(run_once(dataclasses.replace(rc, sim=sim), False).summary.to_row())
        row.pop("wall_s")  # the simulator's own run time
        return row

    base, slower = summary(1.0, True), summary(1.1, True)
    assert float(slower["tpot_p50_s"]) > 1.05 * float(base["tpot_p50_s"])
    assert float(slower["ttft_p50_s"]) > float(base["ttft_p50_s"])
    assert summary(1.1, False) == slower  # booked runs of decode steps price as step by step
