"""A GPU at its power limit (sim.power_limit, SimConfig.power_curve): the curve, the recent rate
on the device's line of steps, the profiled model's device work scaled by it, the setting's
checks, and fast-forward bit for bit with it on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import SchedulerConfig, make_scheduler
from engine.core.executor import BackendInfo
from engine.core.fleet import run_fleet
from engine.core.loop import Replica, SimulatedClock, run
from engine.core.routers import ROUTER_REGISTRY
from harness.config import ConfigError
from harness.run import run_once
from harness.scripting import compose_run_config
from sim.executor import SimExecutor
from sim.power_limit import PowerCurve, PowerLimit, read_power_curve
from sim.roofline import RooflineCostModel
from tests.sim import helpers
from tests.sim.test_fast_forward import POLICIES, _requests, _state, _tables

H200_06 = "profiles/h200/qwen3-0.6b.power.json"
# a curve the tests' small roofline steps move along: their prefills come at a few thousand tokens a second
TEST_CURVE = PowerCurve("H100-SXM5-80GB", "qwen3-0.6b", 0.02, (0.0, 2000.0, 8000.0), (1.0, 1.1, 1.5), (1.0, 1.05, 1.3))


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_the_curve_is_linear_between_its_points_and_flat_past_them():
    curve = TEST_CURVE
    assert curve.scale(1000.0, prefill=True) == pytest.approx(1.05)
    assert curve.scale(5000.0, prefill=False) == pytest.approx(1.175)
    assert curve.scale(1e9, prefill=True) == 1.5 and curve.scale(-1.0, prefill=False) == 1.0


@pytest.mark.parametrize("change, error", [
    ({"window_s": 0.0}, "window_s"),
    ({"prefill_tokens_per_s": (0.0, 3000.0, 2000.0)}, "ascending"),
    ({"decode_scale": (1.0, 1.1)}, "decode_scale must hold 3"),
    ({"prefill_scale": (1.0, 0.0, 1.2)}, "prefill_scale"),
])
def test_a_curve_out_of_shape_is_refused(change, error):
    fields = {"hardware": "h", "model": "m", "window_s": 1.0, "prefill_tokens_per_s": (0.0, 1.0, 2.0),
              "prefill_scale": (1.0, 1.0, 1.1), "decode_scale": (1.0, 1.0, 1.0), **change}
    with pytest.raises(ValueError, match=error):
        PowerCurve(**fields)


def test_a_file_that_is_not_a_curve_is_named(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"hardware": "h", "model": "m"}))
    with pytest.raises(ValueError, match=r"c\.json: a power curve needs \['window_s'"):
        read_power_curve(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=r"c\.json: not a power curve"):
        read_power_curve(path)


def test_the_shipped_curves_read_and_slow_steps_only_at_high_prefill_rates():
    for path in (H200_06, "profiles/h200/qwen3-8b.power.json"):
        curve = read_power_curve(path)
        assert curve.hardware == "H200-SXM-141GB" and curve.scale(0.0, True) == 1.0
        assert 1.05 < curve.scale(1e9, True) < 1.15 and 1.03 < curve.scale(1e9, False) < 1.07


def test_the_rate_is_the_prefill_of_the_window_before_the_step_on_the_device_line():
    power, clock = PowerLimit(TEST_CURVE), _Clock()
    power.clock = clock
    assert power.scale_for(100) == 1.0  # nothing ran yet
    power.ran(0.005, 100)  # ends at 0.005: 100 tokens in the window, 5,000 tokens/s
    assert power.scale_for(0) == pytest.approx(TEST_CURVE.scale(5000.0, False))
    power.ran(0.010, 0)  # a decode step, 0.005 .. 0.015
    assert power.scale_for(40) == pytest.approx(TEST_CURVE.scale(5000.0, True))
    power.ran(0.004, 40)  # 0.015 .. 0.019
    clock.t = 0.030  # an idle device: the next step starts at the clock, the first prefill out of the window
    assert power.scale_for(40) == pytest.approx(TEST_CURVE.scale(2000.0, True))
    power.ran(0.001, 0)
    assert power.scale_for(0, queued=True) == pytest.approx(TEST_CURVE.scale(2000.0, False))  # starts at 0.031
    clock.t = 1.0
    assert power.scale_for(0) == 1.0


class _Powered:
    """The roofline with a power_scale (as the profiled model has): priced one step at a time."""

    def __init__(self) -> None:
        self.inner = RooflineCostModel(helpers.model("qwen3-0.6b"), helpers.hardware("h100"))
        self.power_scale = 1.0

    def step_time(self, plan):
        return self.inner.step_time(plan) * self.power_scale

    def drained(self) -> None:
        pass


class _PoweredRepeats(_Powered):
    """The same, pricing a run's repeats from one plan (as the profiled model's decode_repeats)."""

    def decode_repeats(self, plan):
        for duration in self.inner.decode_repeats(plan):
            yield duration * self.power_scale


def _executor(fast: bool, overlap: bool, num_blocks: int, cost: type, curve: PowerCurve | None) -> SimExecutor:
    info = BackendInfo(num_blocks=num_blocks, block_size=4, vocab_size=97, eos_token_ids=(5,), overlaps_steps=overlap)
    return SimExecutor(cost(), info, seed=3, fast_forward=fast, power=curve)


def _serve(fast, cost, curve, policy, overlap, caching, num_blocks, seed, n, max_num_seqs, burst=False):
    """burst: every request arrives at 0 (the device is busy to the end)."""
    executor = _executor(fast, overlap, num_blocks, cost, curve)
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=64, max_model_len=60, policy=policy)
    scheduler = make_scheduler(config, executor.info())
    scheduler.block_manager.enable_prefix_caching = caching
    requests = _requests(seed, n, 60, True)
    for request in requests if burst else ():
        request.arrival_time = 0.0
    result = run(scheduler, executor, requests, SimulatedClock())
    return _state(result, scheduler)


def test_a_power_curve_slows_a_busy_run():
    args = ("nano", True, True, 64, 7, 30, 8)
    plain = _serve(False, _Powered, None, *args, burst=True)
    powered = _serve(False, _Powered, TEST_CURVE, *args, burst=True)
    assert plain[3] * 1.02 < powered[3] < plain[3] * 1.5  # makespan: slower, by no more than the curve's top


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from((_Powered, _PoweredRepeats)), st.sampled_from(POLICIES), st.booleans(), st.booleans(),
       st.integers(16, 80), st.integers(0, 10**6), st.integers(1, 30), st.integers(1, 8))
def test_fast_forward_with_a_power_curve_matches_step_by_step(cost, policy, overlap, caching, num_blocks, seed, n,
                                                              max_num_seqs):
    args = (cost, TEST_CURVE, policy, overlap, caching, num_blocks, seed, n, max_num_seqs)
    assert _serve(True, *args) == _serve(False, *args)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(POLICIES), st.booleans(), st.integers(0, 10**6), st.integers(1, 30),
       st.sampled_from(("round_robin", "least_requests", "least_tokens")))
def test_fast_forward_with_a_power_curve_matches_step_by_step_in_a_fleet(policy, overlap, seed, n, router):
    def serve(fast: bool):
        replicas = []
        for i in range(2):
            executor = _executor(fast, overlap, 64, _Powered, TEST_CURVE)
            config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=60, policy=policy)
            replicas.append(Replica(i, make_scheduler(config, executor.info()), executor, SimulatedClock()))
        result = run_fleet(replicas, _requests(seed, n, 60, False), ROUTER_REGISTRY.get(router)())
        return [_tables(r.result) for r in replicas], result.makespan_s
    assert serve(True) == serve(False)


def _h200_run(*extra: str):
    return compose_run_config(["model=qwen3-0.6b", "hardware=h200", "backend=sim", "backend.cost_model=profiled",
                               "workload=poisson", "workload.rate=400", "workload.num_requests=300",
                               "workload.prompt_len.low=1800", "workload.prompt_len.high=2200",
                               "workload.output_len.low=4", "workload.output_len.high=12", *extra])


def test_the_profiled_model_at_full_prefill_load_runs_slower_with_the_h200_curve():
    plain = run_once(_h200_run(), False).summary
    powered = run_once(_h200_run(f"backend.power_curve={H200_06}"), False).summary
    assert powered["ttft_p50_s"] > plain["ttft_p50_s"]
    assert 1.01 < powered["makespan_s"] / plain["makespan_s"] < 1.09  # at most the curve's last prefill factor


def test_a_curve_of_another_model_or_gpu_or_cost_model_is_refused():
    from harness.config import load_hardware
    from sim import power_curve

    rc = _h200_run(f"backend.power_curve={H200_06}")
    with pytest.raises(ValueError, match=r"measured for qwen3-0.6b on H200-SXM-141GB \(GH100, 700.0 W\); this run is "
                                         r"qwen3-0.6b on A100-SXM4-80GB \(GA100, 400.0 W\)"):
        power_curve(rc.model, load_hardware("a100", "test"), rc.sim)
    with pytest.raises(ValueError, match="measured for qwen3-0.6b on H200-SXM-141GB .*this run is qwen3-8b"):
        power_curve(dataclasses.replace(rc.model, name="qwen3-8b"), rc.hardware, rc.sim)
    with pytest.raises((ValueError, ConfigError), match="power_curve .*needs cost_model=profiled"):
        compose_run_config(["model=qwen3-0.6b", "hardware=h200", "backend=sim", f"backend.power_curve={H200_06}"])
    with pytest.raises(ConfigError, match="backend.power_curve: "):
        compose_run_config(["backend=sim", "backend.cost_model=profiled", "backend.power_curve=nowhere.json"])


def _h100_run(curve: str):
    return compose_run_config(["model=qwen3-0.6b", "hardware=h100", "backend=sim", "backend.cost_model=profiled",
                               "workload=poisson", "workload.rate=300", "workload.num_requests=200",
                               "workload.prompt_len.low=1800", "workload.prompt_len.high=2200",
                               "workload.output_len.low=4", "workload.output_len.high=12",
                               f"backend.power_curve={curve}"])


def test_the_h200_curve_prices_an_h100_the_same_die_at_the_same_limit(tmp_path):
    curve = read_power_curve(H200_06)
    assert (curve.chip, curve.power_limit_w) == ("GH100", 700.0)
    plain = run_once(_h100_run("null"), False).summary
    powered = run_once(_h100_run(H200_06), False).summary
    assert powered["makespan_s"] > plain["makespan_s"] and powered["ttft_p50_s"] > plain["ttft_p50_s"]
    # a curve that does not record its GPU's die and limit prices that GPU alone
    bare = {k: v for k, v in json.loads((Path(H200_06)).read_text()).items() if k not in ("chip", "power_limit_w")}
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(bare))
    assert read_power_curve(path).chip is None
    with pytest.raises(ValueError, match=r"H200-SXM-141GB \(die not recorded, \? W\); this run is qwen3-0.6b on H100"):
        run_once(_h100_run(str(path)), False)


def test_a_run_moved_to_another_gpu_keeps_a_curve_that_holds_there():
    from harness.config import load_hardware, on_hardware

    rc = _h200_run(f"backend.power_curve={H200_06}")
    moved = on_hardware(rc, load_hardware("h100", "test"))
    assert moved.hardware.name == "H100-SXM5-80GB" and moved.sim.power_curve == rc.sim.power_curve
    with pytest.raises(ConfigError, match="another die or power limit than A100-SXM4-80GB"):
        on_hardware(rc, load_hardware("a100", "test"))


def test_an_interval_prices_its_draws_with_the_power_curve_too():
    from harness.fidelity.interval import simulate_with_interval
    from sim.interval import IntervalConfig

    rc = _h200_run(f"backend.power_curve={H200_06}", "workload.num_requests=120")
    plain = _h200_run("workload.num_requests=120")
    config = IntervalConfig(draws=3, machine_spread=0.0)
    powered, unpowered = (simulate_with_interval(r, config).summary for r in (rc, plain))
    assert powered["e2e_p90_s_lo"] > unpowered["e2e_p90_s_lo"]  # every draw slowed, not just the point


def test_auto_finds_the_shipped_curve_of_the_model_on_this_gpu_or_one_of_its_die():
    for hardware in ("h200", "h100"):
        rc = compose_run_config(["model=qwen3-8b", f"hardware={hardware}", "backend=sim", "backend.cost_model=profiled",
                                 "backend.profile_path=profiles/h100/qwen3-8b.csv", "backend.power_curve=auto"])
        assert rc.sim.power_curve.endswith("profiles/h200/qwen3-8b.power.json")
    with pytest.raises(ConfigError, match=r"power_curve=auto: no shipped power curve prices model=qwen3-0.6b on "
                                          r"A100-SXM4-80GB \(GA100, 400.0 W; profiles/ has h200/qwen3-0.6b.power.json"):
        compose_run_config(["model=qwen3-0.6b", "hardware=a100", "backend=sim", "backend.cost_model=profiled",
                            "backend.profile_path=profiles/h100/qwen3-0.6b.csv", "backend.power_curve=auto"])
