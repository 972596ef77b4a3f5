"""backend.idle_start: a step submitted onto an idle device waits the engine loop's host work before
its first kernel (hardware.idle_start_host_s); a step queued behind one in flight does not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core import CacheConfig, ExecutionConfig, Request, SamplingParams, SchedulerConfig, make_scheduler
from engine.core.executor import BackendInfo
from engine.core.loop import SimulatedClock, run
from sim import CostModel, ProfiledCostModel, RooflineCostModel, SimConfig, SimExecutor, build_sim_executor
from sim.interval import PerturbedCostModel
from sim.tp_transfer import TPTransferCostModel
from tests.sim.helpers import decode_batch, hardware, model, plan, prefill
from tests.sim.test_profiled import GRAPH
from tests.sim.test_profiled_overlap import overlapping_profile

HOST_S = 1e-3


def _executor(idle_start_s: float) -> tuple[SimExecutor, RooflineCostModel]:
    cost = RooflineCostModel(model("qwen3-0.6b"), hardware("h200"))
    return SimExecutor(cost, BackendInfo(1000, 16, 1000, overlaps_steps=True), idle_start_s=idle_start_s), cost


def test_only_a_step_onto_an_idle_device_waits_the_host_work():
    executor, cost = _executor(HOST_S)
    first, second = plan(prefill(300)), decode_batch([500] * 8)
    a = executor.submit(first)  # nothing in flight
    b = executor.submit(second)  # queued behind a
    assert a.result().duration_s == pytest.approx(cost.step_time(first) + HOST_S)
    assert b.result().duration_s == pytest.approx(cost.step_time(second))
    c = executor.submit(first)  # both read: the device is idle again
    assert c.result().duration_s == pytest.approx(cost.step_time(first) + HOST_S)
    assert executor.execute(first).duration_s == pytest.approx(cost.step_time(first))  # one at a time: the host fit's


@settings(max_examples=25, deadline=None)
@given(gaps=st.lists(st.floats(0.0, 0.05), min_size=1, max_size=12), host=st.floats(1e-4, 5e-3))
def test_a_lone_requests_latency_grows_by_the_host_work_once_per_idle_start(gaps, host):
    """Requests that arrive after the previous one finished: each first token is host later, each
    request's other tokens keep their times relative to it."""
    runs = {}
    for on in (False, True):
        spec, hw = model("qwen3-0.6b"), dataclasses.replace(hardware("h200"), idle_start_host_s=host)
        sim = SimConfig(idle_start=on, execution=ExecutionConfig(async_scheduling=True))
        scheduler_config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=4096)
        cache = CacheConfig(block_size=16, num_blocks=400)
        executor = build_sim_executor(spec, hw, sim, cache, scheduler_config)
        requests, t = [], 0.0
        for i, gap in enumerate(gaps):
            t += 1.0 + gap  # each finishes long before the next arrives
            requests.append(Request(f"r{i}", list(range(1, 200 + 10 * i)), SamplingParams(max_tokens=6),
                                    arrival_time=t))
        runs[on] = run(make_scheduler(scheduler_config, executor.info(), cache), executor, requests, SimulatedClock())
    for off, on in zip(runs[False].requests, runs[True].requests, strict=True):
        assert on.first_token_time - off.first_token_time == pytest.approx(host, abs=1e-9)
        assert on.finish_time - off.finish_time == pytest.approx(host, abs=1e-9)


def test_off_by_default_and_refused_without_a_figure_or_overlap():
    spec, cache, sched = model("qwen3-0.6b"), CacheConfig(16, 40), SchedulerConfig()
    assert build_sim_executor(spec, hardware("h200"), SimConfig(), cache, sched).idle_start_s == 0.0
    assert hardware("h200").idle_start_host_s is not None
    assert build_sim_executor(spec, hardware("h200"), SimConfig(idle_start=True), cache,
                              sched).idle_start_s == hardware("h200").idle_start_host_s
    with pytest.raises(ValueError, match="idle_start_host_s"):
        build_sim_executor(spec, hardware("h100"), SimConfig(idle_start=True), cache, sched)
    with pytest.raises(ValueError, match="async_scheduling"):
        build_sim_executor(spec, hardware("h200"), SimConfig(idle_start=True, execution=ExecutionConfig(
            async_scheduling=False)), cache, sched)
    with pytest.raises(ValueError, match="idle_start must be true, false or null"):
        SimConfig(idle_start=1)
    with pytest.raises(ValueError, match="idle_start_s"):
        SimExecutor(RooflineCostModel(spec, hardware("h200")), BackendInfo(10, 16, 1000), idle_start_s=-1.0)


def test_refused_beside_a_profile_whose_leads_price_it_already():
    """A lead is timed from submit() on an idle device: it holds the anchor and the batch's building."""
    profile = overlapping_profile()
    with_leads = ProfiledCostModel.fit(profile.assign(lead_s=np.full(len(profile), 4e-4)), GRAPH)
    spec, cache, sched = model("qwen3-0.6b"), CacheConfig(16, 40), SchedulerConfig()
    assert with_leads.prices_lead
    # wrapped as a TP run or an interval's perturbed draw prices it, the lead is the profile's still
    tp = TPTransferCostModel(with_leads, spec, hardware("h200"), 2)
    drawn = PerturbedCostModel(with_leads, [0.0], 1.0, np.random.default_rng(0))
    plain = PerturbedCostModel(RooflineCostModel(spec, hardware("h200")), [0.0], 1.0, np.random.default_rng(0))
    assert (tp.prices_lead, drawn.prices_lead, plain.prices_lead) == (True, True, False)
    for priced in (with_leads, tp, drawn):
        with pytest.raises(ValueError, match="lead fits"):
            build_sim_executor(spec, hardware("h200"), SimConfig(idle_start=True), cache, sched, cost_model=priced)
    no_leads = build_sim_executor(spec, hardware("h200"), SimConfig(idle_start=True), cache, sched)
    assert no_leads.idle_start_s == hardware("h200").idle_start_host_s


def test_null_prices_it_where_true_would_beside_a_profile_and_nowhere_else() -> None:
    """idle_start None (the held-out protocol's): the figure for a profiled model without lead fits on
    hardware that has one, with overlapped steps; 0, never a refusal, for a profile with leads, hardware
    without the figure, steps one at a time or the roofline."""
    profile = overlapping_profile()
    no_leads = ProfiledCostModel.fit(profile, GRAPH)
    with_leads = ProfiledCostModel.fit(profile.assign(lead_s=np.full(len(profile), 4e-4)), GRAPH)
    spec, cache, sched = model("qwen3-0.6b"), CacheConfig(16, 40), SchedulerConfig()
    auto = SimConfig(cost_model="profiled", profile_path="given.csv", idle_start=None)
    one_at_a_time = dataclasses.replace(auto, execution=ExecutionConfig(async_scheduling=False))

    def idle_s(sim: SimConfig, hw: str, cost: CostModel) -> float:
        return build_sim_executor(spec, hardware(hw), sim, cache, sched, cost_model=cost).idle_start_s

    assert idle_s(auto, "h200", no_leads) == hardware("h200").idle_start_host_s
    drawn = PerturbedCostModel(no_leads, [0.0], 1.0, np.random.default_rng(0))  # an interval's draw
    assert idle_s(auto, "h200", drawn) == hardware("h200").idle_start_host_s
    assert idle_s(auto, "h200", with_leads) == 0.0
    assert idle_s(auto, "h100", no_leads) == 0.0
    assert idle_s(one_at_a_time, "h200", no_leads) == 0.0
    assert idle_s(SimConfig(idle_start=None), "h200", RooflineCostModel(spec, hardware("h200"))) == 0.0


def test_fast_forward_books_the_same_times_as_step_by_step():
    """Runs of decode steps booked at once never hold an idle start (one is always in flight)."""
    spec, hw = model("qwen3-0.6b"), hardware("h200")
    scheduler_config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=4096)
    cache = CacheConfig(block_size=16, num_blocks=400)
    times = {}
    for fast in (False, True):
        sim = SimConfig(idle_start=True, fast_forward=fast)
        executor = build_sim_executor(spec, hw, sim, cache, scheduler_config)
        requests = [Request(f"r{i}", list(range(1, 100 + 37 * i)), SamplingParams(max_tokens=40 + 3 * i),
                            arrival_time=0.3 * (i // 3) + 0.001 * i) for i in range(9)]
        result = run(make_scheduler(scheduler_config, executor.info(), cache), executor, requests, SimulatedClock())
        times[fast] = [t for r in result.requests for t in (r.first_token_time, r.finish_time)]
    assert times[True] == pytest.approx(times[False], abs=1e-12)
