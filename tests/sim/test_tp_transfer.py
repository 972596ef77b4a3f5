"""Tensor parallelism in the simulator: each term of a TP step scales as sim/tp_transfer.py says."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.config import ExecutionConfig
from sim.config import SimConfig
from sim.cost_model import make_cost_model
from sim.features import step_features
from sim.profiled import ProfiledCostModel
from sim.roofline import RooflineCostModel
from sim.tp_transfer import TPTransferCostModel
from tests.sim.helpers import decode, decode_batch, hardware, model, plan, prefill
from tests.sim.test_profiled import GRAPH
from tests.sim.test_profiled_overlap import LAUNCH_DECODE, LAUNCH_PREFILL, at_step, overlapping_profile

TP2 = ExecutionConfig(tensor_parallel_size=2)

QWEN8B, H200 = model("qwen3-8b"), hardware("h200")
DECODE_256 = decode_batch([800] * 256)
PREFILL_8K = plan(prefill(8192))


def expected_communication(spec, hw, tp, num_tokens, num_sampled, whole_vocab=False):
    """Written out from the documented rule, independently of the roofline's precomputed terms."""
    link = hw.interconnect_bandwidth * hw.interconnect_efficiency
    all_reduce = hw.interconnect_latency_s + 2 * (tp - 1) / tp * num_tokens * spec.hidden_size * spec.dtype_bytes / link
    gather = hw.interconnect_latency_s + (tp - 1) / tp * num_sampled * spec.vocab_size * spec.dtype_bytes / link
    return (2 * spec.num_layers + 1) * all_reduce + (gather if whole_vocab else hw.interconnect_latency_s)


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("tokens, sampled", [(256, 256), (8192, 1), (1, 1)])
@pytest.mark.parametrize("whole_vocab", [False, True])
def test_communication_is_two_ring_all_reduces_per_layer_plus_embedding_and_sampling(tp, tokens, sampled,
                                                                                     whole_vocab):
    cost = RooflineCostModel(QWEN8B, H200, tp)
    assert cost.communication_time(tokens, sampled, whole_vocab) == pytest.approx(
        expected_communication(QWEN8B, H200, tp, tokens, sampled, whole_vocab), rel=1e-12)
    assert RooflineCostModel(QWEN8B, H200, 1).communication_time(tokens, sampled, whole_vocab) == 0.0


def test_communication_reads_the_link_from_the_hardware_config():
    fast = dataclasses.replace(H200, interconnect_bandwidth=2 * H200.interconnect_bandwidth, interconnect_latency_s=0.0)
    slow = dataclasses.replace(H200, interconnect_latency_s=0.0)
    ratio = RooflineCostModel(QWEN8B, slow, 2).communication_time(4096, 0) / \
        RooflineCostModel(QWEN8B, fast, 2).communication_time(4096, 0)
    assert ratio == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("step", [DECODE_256, PREFILL_8K], ids=["decode256", "prefill8k"])
def test_sharded_work_is_one_tp_th_and_host_does_not_shrink(tp, step):
    transfer = TPTransferCostModel(RooflineCostModel(QWEN8B, H200, 1), QWEN8B, H200, tp)
    terms = transfer.terms(step)
    # Qwen3-8B shards evenly (32 heads, 8 KV heads); only the norms are replicated.
    assert terms["shard_ratio"] == pytest.approx(1 / tp, rel=2e-3)
    assert terms["host"] == RooflineCostModel(QWEN8B, H200, tp).host_time(len(step.scheduled))
    assert terms["device"] == pytest.approx(terms["device_tp1"] * terms["shard_ratio"], rel=1e-12)


def test_replicated_kv_heads_shard_less_than_one_tp_th():
    tiny = model("tiny-qwen3")  # 2 KV heads: at TP=4 each rank keeps a whole one
    decode_heavy = decode_batch([4000] * 64)
    ratio = TPTransferCostModel(RooflineCostModel(tiny, H200, 1), tiny, H200, 4).terms(decode_heavy)["shard_ratio"]
    assert ratio > 0.25 + 0.01


steps = st.lists(st.one_of(st.builds(lambda c, i: decode(c, rid=f"d{i}"), st.integers(0, 8000), st.integers()),
                           st.builds(lambda n, c, i: prefill(n, c, rid=f"p{i}"), st.integers(1, 4096),
                                     st.integers(0, 4096), st.integers())),
                 min_size=1, max_size=32, unique_by=lambda e: e.request_id)


@settings(max_examples=60, deadline=None)
@given(steps, st.sampled_from([2, 4, 8]))
def test_transfer_of_the_tp1_roofline_is_the_roofline_at_tp(entries, tp):
    step = plan(*entries)
    transfer = TPTransferCostModel(RooflineCostModel(QWEN8B, H200, 1), QWEN8B, H200, tp)
    assert transfer.step_time(step) == pytest.approx(RooflineCostModel(QWEN8B, H200, tp).step_time(step), rel=1e-9)


@pytest.mark.parametrize("step, launch", [(decode_batch([1000] * 50), LAUNCH_DECODE),
                                          (plan(prefill(300)), LAUNCH_PREFILL)])
def test_profiled_transfer_adds_launches_to_the_sharded_device_time(step, launch):
    small = model("qwen3-0.6b")
    profiled = ProfiledCostModel.fit(overlapping_profile(), GRAPH)
    profiled.launch_delay_s = 4e-4
    terms = TPTransferCostModel(profiled, small, H200, 2).terms(step)
    launch_s, gpu_s = profiled.overlap_parts(step_features(step, GRAPH))
    assert launch_s == pytest.approx(launch, rel=0.02)
    # Run on its own (a fresh model: nothing in flight), the loop's work, the launches and the
    # sharded device time add.
    assert terms["host"] == pytest.approx(4e-4 + launch_s, rel=1e-12)
    assert terms["device_tp1"] == pytest.approx(gpu_s, rel=1e-12)
    total = TPTransferCostModel(profiled, small, H200, 2).step_time(step)
    assert total == pytest.approx(4e-4 + launch_s + gpu_s * terms["shard_ratio"] + terms["communication"],
                                  rel=1e-12)
    assert total > max(launch_s, gpu_s / 2)


def test_overlapped_tp_step_hides_its_launches_by_the_tp1_rule():
    small = model("qwen3-0.6b")
    profiled = ProfiledCostModel.fit(overlapping_profile(), GRAPH)
    profiled.launch_delay_s = 4e-4
    transfer = TPTransferCostModel(profiled, small, H200, 2)
    decode_step, prefill_step = at_step(decode_batch([1000] * 50), 1), at_step(plan(prefill(300)), 2)
    transfer.drained()
    decode_price = transfer.step_time(decode_step)
    terms = transfer.terms(decode_step)
    assert decode_price == pytest.approx(terms["host"] + terms["device"] + terms["communication"], rel=1e-12)
    terms = transfer.terms(prefill_step)
    device = terms["device"] + terms["communication"]
    free = decode_price - LAUNCH_DECODE - 4e-4  # host time left free while the decode ran
    assert LAUNCH_PREFILL - free > device  # launch-bound: some of the launch shows
    assert transfer.step_time(prefill_step) == pytest.approx(LAUNCH_PREFILL - free, rel=0.02)
    transfer.drained()  # nothing in flight: the whole price again
    assert transfer.step_time(prefill_step) == pytest.approx(terms["host"] + device, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["decode", "small", "large"]), st.booleans()), min_size=1, max_size=12))
def test_overlapped_tp_steps_cost_between_their_device_time_and_their_whole_price(sequence):
    steps = {"decode": decode_batch([1000] * 50), "small": plan(prefill(300)), "large": plan(prefill(8192))}
    profiled = ProfiledCostModel.fit(overlapping_profile(), GRAPH)
    profiled.launch_delay_s = 4e-4
    transfer = TPTransferCostModel(profiled, model("qwen3-0.6b"), H200, 2)
    for index, (name, drained) in enumerate(sequence):
        if drained:
            transfer.drained()
        step = at_step(steps[name], index + 1)
        terms = transfer.terms(step)
        device = terms["device"] + terms["communication"]
        whole = terms["host"] + device
        price = transfer.step_time(step)
        assert device * (1 - 1e-12) <= price <= whole * (1 + 1e-12)
        if drained or index == 0:
            assert price == pytest.approx(whole, rel=1e-12)


def test_sim_config_overlaps_tp_steps_and_transfers_tp1_profiles(tmp_path):
    # one rule for both backends: overlapped on (a stand-in for) CUDA at any TP size
    assert ExecutionConfig(tensor_parallel_size=1).overlaps_steps(True)
    assert ExecutionConfig(tensor_parallel_size=2).overlaps_steps(True)
    path = tmp_path / "profile.csv"
    overlapping_profile().to_csv(path, index=False)
    sim = SimConfig(cost_model="profiled", profile_path=str(path), execution=TP2, profile_tp_size=1)
    assert isinstance(make_cost_model(model("qwen3-0.6b"), H200, sim, GRAPH), TPTransferCostModel)
    measured_at_tp = SimConfig(cost_model="profiled", profile_path=str(path), execution=TP2)
    assert isinstance(make_cost_model(model("qwen3-0.6b"), H200, measured_at_tp, GRAPH), ProfiledCostModel)
    with pytest.raises(ValueError, match="profile_tp_size"):
        SimConfig(execution=ExecutionConfig(tensor_parallel_size=4), profile_tp_size=2)


def test_a_transferred_profile_serves_a_whole_run_at_tp2(tmp_path):
    """The executor drives the cost model through the whole protocol (drained() before every step
    run one at a time); at TP=2 those steps are priced sharded, not as the TP=1 run's."""
    from engine.core import CacheConfig, Request, SamplingParams, SchedulerConfig, make_scheduler
    from engine.core.loop import SimulatedClock, run
    from sim import build_sim_executor

    path = tmp_path / "profile.csv"
    overlapping_profile().to_csv(path, index=False)
    makespans = []
    tp2_sync = dataclasses.replace(TP2, async_scheduling=False)
    for execution, tp1_profile in ((ExecutionConfig(), None), (TP2, 1), (tp2_sync, 1)):
        sim = SimConfig(cost_model="profiled", profile_path=str(path), execution=execution, profile_tp_size=tp1_profile)
        executor = build_sim_executor(model("qwen3-0.6b"), H200, sim, CacheConfig(), SchedulerConfig())
        requests = [Request(str(i), [1] * 300, SamplingParams(max_tokens=40, ignore_eos=True)) for i in range(16)]
        result = run(make_scheduler(SchedulerConfig(), executor.info()), executor, requests, SimulatedClock())
        assert len(result.requests) == 16
        makespans.append(result.makespan_s)
    assert all(m > 0 for m in makespans) and makespans[0] != makespans[1]
    assert makespans[1] < makespans[2]  # overlapped, the launches hide behind the step before
