"""EngineExecutor on the tiny checkpoint: the Executor protocol, timing, precision, lifecycle."""

from __future__ import annotations

import time

import pytest
import torch

from engine.config import EngineConfig
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.loop import SimulatedClock, run
from engine.core.policies import make_scheduler
from engine.core.request import Request
from engine.core.sampling_params import SamplingParams
from engine.executor import EngineExecutor
from engine.kv_sizing import CPU_KV_CACHE_BYTES

SCHED = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)


def _executor(model_dir, cache: CacheConfig | None = None, **engine) -> EngineExecutor:
    cache = cache or CacheConfig(block_size=8)
    return EngineExecutor(EngineConfig(model=str(model_dir), device="cpu", **engine), SCHED, cache)


def test_protocol_attributes(tiny_qwen3_dir):
    executor = _executor(tiny_qwen3_dir)
    spec = executor.info()
    assert spec.block_size == 8
    # CPU default: all max_num_seqs sequences at max_model_len, well within the CPU budget here
    assert spec.num_blocks == 8 * (64 // 8) and executor.runner.block_bytes * spec.num_blocks < CPU_KV_CACHE_BYTES
    assert spec.vocab_size == 512
    assert spec.eos_token_id == executor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert not spec.overlaps_steps and not spec.graph_sizes  # CPU: steps run one at a time, eagerly
    assert spec.device == "cpu, float32" and executor.hold_device(0.01) is False
    assert executor.runner.dtype is torch.float32  # "auto" on CPU
    assert executor.runner.kv_cache.dtype is torch.float32


def test_runs_the_core_loop_and_times_each_step(tiny_qwen3_dir):
    executor = _executor(tiny_qwen3_dir, CacheConfig(block_size=8, num_blocks=20))
    assert executor.info().num_blocks == 20
    scheduler = make_scheduler(SCHED, executor.info(), CacheConfig(block_size=8))
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    requests = [Request(str(i), list(range(1, 4 + 3 * i)), params) for i in range(3)]
    timed = []
    execute = executor.execute

    def timed_execute(plan):
        start = time.perf_counter()
        result = execute(plan)
        timed.append((result.duration_s, time.perf_counter() - start))
        return result

    executor.execute = timed_execute
    seen = []
    executor.observe(lambda plan, step, timing: seen.append((plan.stats.step, step.duration_s, timing.overlapped)))
    result = run(scheduler, executor, requests, SimulatedClock())
    assert [len(r.output_token_ids) for r in result.requests] == [5, 5, 5]
    assert seen == [(s.stats.step, s.duration_s, False) for s in result.steps]  # the hook saw every step once
    assert all(0 < inner <= outer for inner, outer in timed)
    assert result.makespan_s == pytest.approx(sum(inner for inner, _ in timed))


def test_explicit_dtype_reaches_weights_and_cache(tiny_qwen3_dir):
    executor = _executor(tiny_qwen3_dir, dtype="bfloat16")
    assert executor.runner.dtype is torch.bfloat16 and executor.runner.kv_cache.dtype is torch.bfloat16


def test_shutdown_releases_and_blocks_further_steps(tiny_qwen3_dir):
    executor = _executor(tiny_qwen3_dir)
    executor.shutdown()
    executor.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.execute(None)


def test_max_model_len_beyond_the_models_positions_is_refused(tiny_qwen3_dir):
    # tiny-qwen3 is built for 2048 positions: a longer max_model_len would index past its rotary table.
    with pytest.raises(ValueError, match="max_model_len=4096 exceeds the model's max_position_embeddings=2048"):
        EngineExecutor(EngineConfig(model=str(tiny_qwen3_dir), device="cpu"),
                       SchedulerConfig(max_model_len=4096), CacheConfig(block_size=16))
