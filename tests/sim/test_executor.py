"""SimExecutor: deterministic, request-distinct tokens; and whole runs of the core loop on it."""

from __future__ import annotations

import dataclasses
import random

import pytest

from engine.core import (
    BackendInfo,
    CacheConfig,
    ExecutionConfig,
    FinishReason,
    Request,
    SamplingParams,
    SchedulerConfig,
    make_scheduler,
)
from engine.core.executor import StepTiming
from engine.core.loop import SimulatedClock, run
from sim import RooflineCostModel, SimConfig, SimExecutor, build_sim_executor, plan_num_blocks
from tests.sim.helpers import decode, hardware, model, plan, prefill
from tests.sim.test_profiled import profile


class Recording:
    """A cost model wrapper that keeps each step's price and its bytes lower bound."""

    def __init__(self, inner: RooflineCostModel) -> None:
        self.inner = inner
        self.prices: list[float] = []
        self.context_tokens: list[int] = []

    def step_time(self, step):
        self.context_tokens.append(sum(e.num_computed_tokens for e in step.scheduled))
        self.prices.append(self.inner.step_time(step))
        return self.prices[-1]

    def drained(self):
        self.inner.drained()


def _executor(seed=0, vocab=151936, eos=None):
    info = BackendInfo(100, 16, vocab, () if eos is None else (eos,))
    return SimExecutor(RooflineCostModel(model("qwen3-0.6b"), hardware("h100")), info, seed)


def _decodes(rids, context):
    return plan(*(decode(context, rid=r) for r in rids))


def test_tokens_depend_only_on_seed_request_and_position():
    rids = [f"r{i}" for i in range(8)]
    a = _executor().execute(_decodes(rids, 50)).token_ids
    # same request and position in another batch, from another executor: same token
    b = _executor().execute(_decodes(list(reversed(rids)), 50)).token_ids
    assert a == list(reversed(b))
    assert _executor(seed=1).execute(_decodes(rids, 50)).token_ids != a
    assert _executor().execute(_decodes(rids, 51)).token_ids != a


def test_generated_texts_of_different_requests_share_no_prefix():
    executor = _executor()
    rids = [f"req-{i}" for i in range(200)]
    texts = {r: [] for r in rids}
    for position in range(100, 106):
        for r, token in zip(rids, executor.execute(_decodes(rids, position)).token_ids):
            texts[r].append(token)
    first_two = {tuple(t[:2]) for t in texts.values()}
    assert len(first_two) == len(rids)
    assert all(0 <= tok < 151936 for t in texts.values() for tok in t)


def test_never_samples_eos_and_skips_unsampled_chunks():
    executor = _executor(vocab=2, eos=0)
    tokens = executor.execute(_decodes([f"r{i}" for i in range(64)], 10)).token_ids
    assert tokens == [1] * 64
    result = _executor().execute(plan(prefill(100, sample=False), decode(7)))
    assert result.duration_s == RooflineCostModel(model("qwen3-0.6b"), hardware("h100")).step_time(
        plan(prefill(100, sample=False), decode(7)))


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        _executor(vocab=1)
    with pytest.raises(ValueError, match="eos_token_id"):
        _executor(vocab=10, eos=10)


def _workload(n, max_prompt, max_output, seed, rate=None):
    rng = random.Random(seed)
    t = 0.0
    requests = []
    for i in range(n):
        if rate:
            t += rng.expovariate(rate)
        prompt = [rng.randrange(512) for _ in range(rng.randint(1, max_prompt))]
        params = SamplingParams(max_tokens=rng.randint(1, max_output), ignore_eos=False)
        requests.append(Request(f"q{i}", prompt, params, arrival_time=t))
    return requests


@pytest.mark.parametrize("policy", ["nano", "mixed"])
@pytest.mark.parametrize("num_blocks", [None, 12])  # planned (plenty), or tight enough to preempt
def test_core_loop_on_the_simulator_finishes_every_request(policy, num_blocks):
    spec, hw = model("tiny-qwen3"), hardware("cpu")
    scheduler_config = SchedulerConfig(policy=policy, max_num_seqs=16, max_num_batched_tokens=256, max_model_len=512)
    cache = CacheConfig(block_size=16, num_blocks=num_blocks)
    # 1% of a laptop's memory and no reserve: still thousands of blocks of this tiny model
    sim = SimConfig(eos_token_id=0, activation_reserve_bytes=0, execution=ExecutionConfig(gpu_memory_utilization=0.01))
    executor = build_sim_executor(spec, hw, sim, cache, scheduler_config)
    if num_blocks is None:
        assert executor.info().num_blocks == plan_num_blocks(spec, hw, 16, 0.01, 0) > 1000
    recording = executor.cost_model = Recording(executor.cost_model)
    scheduler = make_scheduler(scheduler_config, executor.info(), cache)
    requests = _workload(40, 120, 60, seed=3, rate=200.0)
    result = run(scheduler, executor, requests, SimulatedClock())
    assert not result.rejected
    assert [r.request_id for r in result.requests] == [r.request_id for r in requests]
    for r in result.requests:
        # no EOS is ever drawn, so each request runs to its max_tokens
        assert r.finish_reason is FinishReason.LENGTH and r.num_output_tokens == r.sampling_params.max_tokens
        assert r.arrival_time <= r.first_scheduled_time <= r.first_token_time <= r.finish_time
    assert [s.duration_s for s in result.steps] == recording.prices
    last = result.steps[-1]
    assert result.makespan_s == pytest.approx(last.start_s + last.duration_s)
    if num_blocks == 12:
        assert scheduler.num_preemptions > 0


def test_bench_prediction_respects_the_memory_bound():
    # nano-vllm's bench shape, scaled down: Qwen3-0.6B on H100, prompts and outputs in [100, 1024]
    spec, hw = model("qwen3-0.6b"), hardware("h100")
    config = SchedulerConfig(max_num_seqs=512, max_num_batched_tokens=16384, max_model_len=4096)
    cache = CacheConfig(block_size=256)
    executor = build_sim_executor(spec, hw, SimConfig(), cache, config)
    recording = executor.cost_model = Recording(executor.cost_model)
    rng = random.Random(0)
    requests = [Request(str(i), [rng.randrange(10000) for _ in range(rng.randint(100, 1024))],
                        SamplingParams(max_tokens=rng.randint(100, 1024), ignore_eos=True)) for i in range(32)]
    result = run(make_scheduler(config, executor.info(), cache), executor, requests, SimulatedClock())
    assert len(result.requests) == 32
    weights = spec.weight_bytes  # tied embeddings: the LM head reads the whole table every step
    for price, context in zip(recording.prices, recording.context_tokens):
        assert price >= (weights + spec.kv_bytes_per_token * context) / hw.mem_bandwidth


def test_build_sim_executor_honours_explicit_blocks_and_profiles(tmp_path):
    spec, hw = model("qwen3-0.6b"), hardware("h100")
    profile().to_csv(tmp_path / "steps.csv", index=False)
    sim = SimConfig(cost_model="profiled", profile_path=str(tmp_path / "steps.csv"), vocab_size=1000,
                    execution=ExecutionConfig(seed=3))
    executor = build_sim_executor(spec, hw, sim, CacheConfig(block_size=16, num_blocks=77), SchedulerConfig())
    info = executor.info()
    assert (info.num_blocks, info.block_size, info.vocab_size, executor.seed) == (77, 16, 1000, 3)
    assert executor.execute(plan(prefill(1000, 1024))).duration_s == pytest.approx(
        max(1e-3, 5e-7 * 1000) + 3e-12 * (1000 * 1024 + 1000 * 1001 // 2) + 1e-5, rel=1e-6)
    with pytest.raises(ValueError, match="profile_path"):
        SimConfig(cost_model="profiled")
    with pytest.raises(ValueError, match="cost_model"):
        SimConfig(cost_model="vidur")


def test_info_reports_the_graphs_and_overlap_the_execution_settings_give():
    spec, hw = model("tiny-qwen3"), hardware("cpu")
    config = SchedulerConfig(max_num_seqs=40, max_num_batched_tokens=256, max_model_len=512)

    def info(**execution):
        return build_sim_executor(spec, hw, SimConfig(execution=ExecutionConfig(**execution)), CacheConfig(16, 40),
                                  config).info()

    assert info().graph_sizes.decode == (1, 2, 4, 8, 16, 32, 40)  # no graph beyond max_num_seqs
    assert info(max_graph_batch_size=24).graph_sizes.decode == (1, 2, 4, 8, 16, 24)
    assert not info(enforce_eager=True).graph_sizes
    # auto: overlapped, as the engine on CUDA, at any tensor-parallel size
    assert info().overlaps_steps and info(tensor_parallel_size=2).overlaps_steps
    assert not info(async_scheduling=False).overlaps_steps
    assert not info(async_scheduling=False, tensor_parallel_size=2).overlaps_steps


def test_hooks_see_every_step_once_in_order_with_its_timing():
    seen = []
    executor = _executor()
    executor.observe(lambda plan, result, timing: seen.append((plan, result, timing)))
    first, second = _decodes(["a"], 10), _decodes(["b", "c"], 20)
    executed = executor.execute(first)
    pending = executor.submit(second)
    assert len(seen) == 1  # a submitted step is seen when its result is read
    submitted = pending.result()
    assert [(p, r) for p, r, _ in seen] == [(first, executed), (second, submitted)]
    assert [t.overlapped for _, _, t in seen] == [False, True]
    assert all(isinstance(t, StepTiming) and t.called_s <= t.returned_s for _, _, t in seen)
    assert executor.hold_device(0.1) is False


def decisions(stats):
    """A step's stats less num_running and num_free_blocks: those are taken after planning, when the
    overlapped scheduler has already released the requests this step finishes by length."""
    return dataclasses.replace(stats, num_running=0, num_free_blocks=0)


def test_overlapped_simulation_schedules_offline_work_like_the_plain_one():
    spec, hw = model("tiny-qwen3"), hardware("cpu")
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512)
    runs = {}
    for overlap in (False, True):
        sim = SimConfig(execution=ExecutionConfig(async_scheduling=overlap))
        executor = build_sim_executor(spec, hw, sim, CacheConfig(16, 40), config)
        assert executor.info().overlaps_steps is overlap
        scheduler = make_scheduler(config, executor.info())
        runs[overlap] = run(scheduler, executor, _workload(20, 120, 60, seed=5, rate=None), SimulatedClock())
    plain, overlapped = runs[False], runs[True]
    assert [(decisions(s.stats), s.duration_s) for s in overlapped.steps] == [
        (decisions(s.stats), s.duration_s) for s in plain.steps]
    assert overlapped.makespan_s == pytest.approx(plain.makespan_s)
    assert [r.finish_time for r in overlapped.requests] == pytest.approx([r.finish_time for r in plain.requests])
    assert sum(s.stats.num_preempted for s in plain.steps) > 0  # 40 blocks: the schedule is not trivial
