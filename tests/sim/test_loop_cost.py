"""The serving loop's own work between overlapped submits (SimConfig.loop_s, loop_per_seq_s): a
host-bound step's period is launch + loop at the host's speed; a device-bound one keeps its price;
with none priced every step costs what it did."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.serve.config import ServeConfig, with_server_loop
from sim.config import SimConfig
from sim.features import step_features
from sim.host_speed import with_host_jitter, with_host_scale, with_part_scales
from sim.profiled import ProfiledCostModel
from tests.sim.helpers import decode_batch, plan, prefill
from tests.sim.test_host_speed import priced_run
from tests.sim.test_profiled import GRAPH, grid_plans, true_time
from tests.sim.test_profiled_overlap import LAUNCH_DECODE, LAUNCH_PREFILL, overlapping_profile

LOOP_S, LOOP_PER_SEQ_S = 8e-4, 2e-5


@pytest.fixture(scope="module")
def model():
    return ProfiledCostModel.fit(overlapping_profile(), GRAPH)


def with_loop(model: ProfiledCostModel, loop_s: float = LOOP_S, per_seq: float = LOOP_PER_SEQ_S) -> ProfiledCostModel:
    moved = with_host_scale(model, 1.0)
    moved.loop_s, moved.loop_per_seq_s = loop_s, per_seq
    return moved


@pytest.mark.parametrize("seqs", [1, 4, 16])
def test_a_host_bound_decode_graph_step_takes_launch_plus_loop(model, seqs):
    decode = decode_batch([128] * seqs)
    gpu = true_time(step_features(decode, GRAPH))
    loop = LOOP_S + LOOP_PER_SEQ_S * seqs
    assert gpu < LAUNCH_DECODE + loop  # host-bound once the loop's work is counted
    assert priced_run(model, [decode] * 4)[-1] == pytest.approx(gpu, rel=0.03)  # not without it
    assert priced_run(with_loop(model), [decode] * 4)[-1] == pytest.approx(LAUNCH_DECODE + loop, rel=0.03)
    for scale in (1.5, 2.0):  # the loop's work follows the host as the launches do
        slow = priced_run(with_host_scale(with_loop(model), scale), [decode] * 4)[-1]
        assert slow == pytest.approx(scale * (LAUNCH_DECODE + loop), rel=0.03)


def test_a_device_bound_decode_graph_step_keeps_its_price(model):
    big = decode_batch([4096] * 256)
    gpu = true_time(step_features(big, GRAPH))
    assert gpu > 2 * (LAUNCH_DECODE + LOOP_S + LOOP_PER_SEQ_S * 256)
    for scale in (1.0, 2.0):
        priced = priced_run(with_host_scale(with_loop(model), scale), [big] * 3)
        assert priced == pytest.approx(priced_run(model, [big] * 3))


def test_a_launch_bound_eager_prefill_pays_the_loop_behind_a_busy_host(model):
    small = plan(prefill(300))
    assert true_time(step_features(small, GRAPH)) < LAUNCH_PREFILL
    base = priced_run(model, [small] * 3)[-1]
    looped = priced_run(with_loop(model), [small] * 3)[-1]
    assert base == pytest.approx(LAUNCH_PREFILL, rel=0.03)
    assert looped == pytest.approx(LAUNCH_PREFILL + LOOP_S + LOOP_PER_SEQ_S, rel=0.03)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(range(len(grid_plans()))), min_size=1, max_size=12),
       st.sampled_from([1.0, 0.7, 1.8]))
def test_no_loop_prices_every_step_as_before(model, picks, scale):
    plans = [grid_plans()[i] for i in picks]
    assert priced_run(with_loop(with_host_scale(model, scale), 0.0, 0.0), plans) == \
        priced_run(with_host_scale(model, scale), plans)


def test_the_loop_takes_the_launches_factor_or_its_own(model):
    looped = with_loop(model)
    assert with_host_scale(looped, 1.7).loop_s == pytest.approx(1.7 * LOOP_S)
    assert with_host_scale(looped, 1.7).loop_per_seq_s == pytest.approx(1.7 * LOOP_PER_SEQ_S)
    own = with_part_scales(looped, {"launch": 2.0, "loop": 1.2})
    assert (own.loop_s, own.host_scale) == (pytest.approx(1.2 * LOOP_S), pytest.approx(2.0))
    jittered = with_host_jitter(looped, 0.3, 0)
    assert (jittered.loop_s, jittered.loop_per_seq_s) == (LOOP_S, LOOP_PER_SEQ_S)


def test_a_simulated_run_prices_the_configured_loop():
    from harness.run import run_once
    from harness.scripting import compose_run_config

    rc = compose_run_config(["backend=sim", "backend.cost_model=profiled", "model=qwen3-0.6b", "hardware=h100",
                             "workload.num_requests=30", "workload.arrival=poisson", "workload.rate=20",
                             "workload.prompt_len.low=100", "workload.prompt_len.high=300",
                             "workload.output_len.low=40", "workload.output_len.high=80"])
    base = run_once(rc, False).summary
    looped = run_once(dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, loop_s=2e-3)), False).summary
    assert float(looped["tpot_p50_s"]) > float(base["tpot_p50_s"]) + 1e-3
    none = run_once(dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, loop_s=0.0)), False).summary
    assert float(none["tpot_p50_s"]) == float(base["tpot_p50_s"])


@pytest.mark.parametrize("bad", [-1e-4, 1.0, True, "fast"])
def test_simconfig_refuses_a_loop_that_is_not_seconds(bad):
    with pytest.raises(ValueError, match="SimConfig.loop_s"):
        SimConfig(loop_s=bad)


def test_the_loop_needs_the_profiled_model():
    with pytest.raises(ValueError, match="cost_model=profiled"):
        SimConfig(cost_model="roofline", loop_per_seq_s=1e-6)


def test_the_servers_extra_loop_adds_to_the_simulators_and_is_refused_on_the_engine():
    from harness.scripting import compose_run_config

    rc = compose_run_config(["backend=sim", "backend.cost_model=profiled", "model=qwen3-0.6b", "hardware=h100",
                             "backend.loop_s=1e-4", "backend.loop_per_seq_s=3e-6"])
    served = with_server_loop(rc, ServeConfig(loop_extra_s=2e-5, loop_extra_per_seq_s=1e-6))
    assert (served.sim.loop_s, served.sim.loop_per_seq_s) == (pytest.approx(1.2e-4), pytest.approx(4e-6))
    assert with_server_loop(rc, ServeConfig()) is rc
    engine = compose_run_config(["backend=engine", "model=qwen3-0.6b"])
    with pytest.raises(ValueError, match="backend=sim"):
        with_server_loop(engine, ServeConfig(loop_extra_s=2e-5))
    with pytest.raises(ValueError, match="serve.loop_extra_s"):
        ServeConfig(loop_extra_s=-1.0)


def test_early_tokens_off_is_an_engine_setting_and_a_bool():
    from harness.scripting import compose_run_config

    sim = compose_run_config(["backend=sim", "model=qwen3-0.6b", "hardware=h100"])
    with pytest.raises(ValueError, match="serve.early_tokens=false is for backend=engine"):
        with_server_loop(sim, ServeConfig(early_tokens=False))
    engine = compose_run_config(["backend=engine", "model=qwen3-0.6b"])
    assert with_server_loop(engine, ServeConfig(early_tokens=False)) is engine
    with pytest.raises(ValueError, match="serve.early_tokens must be true or false"):
        ServeConfig(early_tokens="no")  # type: ignore[arg-type]
