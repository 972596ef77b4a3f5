"""KV-cache sizing: the arithmetic on injected memory numbers (CPU), the warm-up steps, and on
CUDA the profile of a real model, checked against what the engine then actually holds."""

from __future__ import annotations

import pytest
import torch

from engine.core.config import ExecutionConfig, SchedulerConfig
from engine.kv_sizing import OTHER_TENSORS_HINT_BYTES, MemoryProfile, num_kv_blocks, tensor_bytes, warmup_plans

GIB = 1024**3


def _profile(**overrides) -> MemoryProfile:
    values = dict(total_bytes=80 * GIB, non_torch_bytes=GIB // 2, weights_bytes=16 * GIB,
                  peak_activation_bytes=3 * GIB, graph_reserve_bytes=GIB // 4)
    values.update(overrides)
    return MemoryProfile(**values)


@pytest.mark.parametrize("utilization", [0.5, 0.9, 1.0])
def test_blocks_fill_what_the_utilisation_leaves(utilization):
    profile = _profile()
    block_bytes = 2 * 36 * 256 * 8 * 128 * 2  # Qwen3-8B shape, block of 256 tokens, bf16
    blocks = num_kv_blocks(profile, utilization, block_bytes, min_blocks=1)
    used = profile.non_torch_bytes + profile.weights_bytes + profile.peak_activation_bytes + profile.graph_reserve_bytes
    # the largest count that fits: one more block would exceed the budget
    assert used + blocks * block_bytes <= profile.total_bytes * utilization
    assert used + (blocks + 1) * block_bytes > profile.total_bytes * utilization


def test_every_term_reduces_the_budget():
    block_bytes = 1 << 20
    base = num_kv_blocks(_profile(), 0.9, block_bytes, 1)
    for field in ("non_torch_bytes", "weights_bytes", "other_bytes", "peak_activation_bytes", "graph_reserve_bytes",
                  "staging_bytes"):
        grown = num_kv_blocks(_profile(**{field: getattr(_profile(), field) + 64 * block_bytes}), 0.9, block_bytes, 1)
        assert grown == base - 64, field


def test_too_little_memory_names_the_setting():
    profile = _profile(weights_bytes=70 * GIB)
    with pytest.raises(ValueError, match="gpu_memory_utilization=0.5"):
        num_kv_blocks(profile, 0.5, 1 << 20, min_blocks=16)  # budget negative
    tight = _profile()
    fits = num_kv_blocks(tight, 0.9, 1 << 20, min_blocks=1)
    assert num_kv_blocks(tight, 0.9, 1 << 20, min_blocks=fits) == fits
    with pytest.raises(ValueError, match="max_model_len") as small:
        num_kv_blocks(tight, 0.9, 1 << 20, min_blocks=fits + 1)
    assert "earlier engine" not in str(small.value)  # nothing but the model's own tables held


def test_tensors_held_besides_the_model_are_named_in_the_error():
    # an earlier engine still alive in the process: its cache is not this model's weights
    held = _profile(weights_bytes=GIB, other_bytes=70 * GIB)
    with pytest.raises(ValueError, match=r"weights 1\.00, other tensors 70\.00.*shut down an earlier engine"):
        num_kv_blocks(held, 0.9, 1 << 20, min_blocks=1 << 16)
    below = _profile(other_bytes=OTHER_TENSORS_HINT_BYTES)
    with pytest.raises(ValueError) as error:
        num_kv_blocks(below, 0.9, 1 << 20, min_blocks=1 << 20)
    assert "earlier engine" not in str(error.value)


def test_tied_weights_are_counted_once():
    embedding = torch.nn.Embedding(100, 8)
    head = torch.nn.Linear(8, 100, bias=False)
    head.weight = embedding.weight  # tied, as Qwen3-0.6B's lm_head
    model = torch.nn.Sequential(embedding, head)
    model.register_buffer("table", torch.zeros(5, dtype=torch.float64))
    cpu = torch.device("cpu")
    assert tensor_bytes(model.parameters(), model.buffers(), device=cpu) == 100 * 8 * 4 + 5 * 8
    assert tensor_bytes(model.parameters(), device=torch.device("cuda")) == 0  # none on that device


@pytest.mark.parametrize("budget,max_len,max_seqs", [(16384, 4096, 512), (1000, 300, 4), (64, 64, 64)])
def test_warmup_plans_are_the_largest_steps(budget, max_len, max_seqs):
    config = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=max_len)
    prefill, short, decode, seeded = warmup_plans(config, block_size=16)
    lengths = [len(e.token_ids) for e in prefill.scheduled]
    assert sum(lengths) == min(budget, max_len * max_seqs) and max(lengths) <= max_len
    assert len(lengths) <= max_seqs
    short_lengths = [len(e.token_ids) for e in short.scheduled]
    assert len(short_lengths) <= max_seqs and sum(short_lengths) <= max(budget, 2)
    assert 2 <= min(short_lengths) and max(short_lengths) <= min(lengths[0], max(2, budget // max_seqs))
    assert not any(e.is_decode for e in prefill.scheduled + short.scheduled)
    assert len(decode.scheduled) == max_seqs and all(len(e.token_ids) == 1 and e.is_decode for e in decode.scheduled)
    for e in prefill.scheduled + short.scheduled + decode.scheduled:
        # one shared table covers a max_model_len sequence, so a one-sequence cache serves all
        assert len(e.block_table) * 16 >= e.context_len and len(e.block_table) == -(-max_len // 16)
        assert e.sample and e.sampling_params.top_p < 1.0  # the sampler's costliest path
    # and the sampler kernel's other variant: temperature alone, a seed per row
    assert [len(e.token_ids) for e in seeded.scheduled] == [1] * max_seqs
    params = [e.sampling_params for e in seeded.scheduled]
    assert all(p.temperature > 0 and p.top_p == 1.0 and p.top_k == -1 and p.seed is not None for p in params)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
def test_profiled_cache_keeps_the_engine_within_its_share(tmp_path):
    from engine.checkpoint import write_checkpoint
    from engine.config import EngineConfig
    from engine.core.config import CacheConfig
    from engine.core.plan import StepPlan
    from engine.executor import EngineExecutor

    model_dir = write_checkpoint("qwen3-0.6b", tmp_path / "m", dtype="bfloat16")
    utilization = 0.5
    sched = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=2048)
    engine_config = EngineConfig(model=str(model_dir), execution=ExecutionConfig(gpu_memory_utilization=utilization))
    executor = EngineExecutor(engine_config,
                              sched, CacheConfig(block_size=256))
    try:
        runner = executor.runner
        profile = runner.memory_profile
        assert profile is not None and executor.uses_cuda_graphs
        assert profile.weights_bytes > 1e9  # 0.6B parameters in bf16 (embeddings tied)
        assert 0 < profile.peak_activation_bytes < 8 * GIB and profile.graph_reserve_bytes > 0
        assert executor.info().num_blocks == num_kv_blocks(profile, utilization, runner.block_bytes, 8)
        # the largest steps again, over the real cache and with the graphs captured: still within the share
        torch.cuda.reset_peak_memory_stats()
        for plan in warmup_plans(sched, 256):
            executor.execute(StepPlan(plan.scheduled, plan.stats))
        free, total = torch.cuda.mem_get_info()
        print(f"held {(total - free) / GIB:.2f} of {total / GIB:.2f} GiB; {profile.describe(utilization)}")
        assert total - free <= total * utilization + GIB  # slack: allocator rounding and fragmentation
    finally:
        executor.shutdown()


def test_warm_up_runs_over_a_given_cache_and_leaves_no_trace(tiny_qwen3_dir):
    from engine import LLM, SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    fresh = LLM(tiny_qwen3_dir, device="cpu", max_model_len=64, block_size=8, num_blocks=16, max_num_seqs=4)
    expected = [o.token_ids for o in fresh.generate(prompts, greedy, use_tqdm=False)]
    warmed = LLM(tiny_qwen3_dir, device="cpu", max_model_len=64, block_size=8, num_blocks=16, max_num_seqs=4)
    assert warmed.executor.runner.warm_up()  # 16 blocks hold one 64-token sequence
    assert [o.token_ids for o in warmed.generate(prompts, greedy, use_tqdm=False)] == expected
    small = LLM(tiny_qwen3_dir, device="cpu", max_model_len=64, block_size=8, num_blocks=4, max_num_seqs=4)
    assert not small.executor.runner.warm_up()


@pytest.mark.gpu
@needs_cuda
def test_an_engine_left_unreachable_does_not_shrink_the_next_ones_cache(tiny_qwen3_dir):
    from engine import LLM

    settings = dict(device="cuda", max_model_len=64, block_size=16, gpu_memory_utilization=0.4)
    first = LLM(tiny_qwen3_dir, **settings)
    blocks = first.executor.info().num_blocks
    first.cycle = first  # unreachable after del, but freed only when the collector runs
    del first
    second = LLM(tiny_qwen3_dir, **settings)
    try:
        assert second.executor.info().num_blocks >= 0.98 * blocks
        # one still alive is named as such, not counted as this model's weights
        with pytest.raises(ValueError, match="shut down an earlier engine"):
            LLM(tiny_qwen3_dir, **{**settings, "gpu_memory_utilization": 0.3})
    finally:
        second.shutdown()
