"""Tensor parallelism with real worker processes: gloo on CPU here, NCCL on GPUs in test_tp_gpu.

A TP engine must produce exactly the single-process engine's tokens (float32 on CPU: the sums
over ranks differ from the single matmul only by rounding far below any sampling margin), and
leave no process behind.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch.distributed as dist

from engine import LLM, SamplingParams

PROMPTS = [[5, 17, 300, 42, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [400, 3], list(range(100, 140))]


def _generate(model_dir, tp, params):
    llm = LLM(str(model_dir), device="cpu", max_model_len=96, block_size=4, max_num_batched_tokens=32,
              tensor_parallel_size=tp)
    try:
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        workers = llm.executor.workers
        procs = list(workers.procs) if workers else []
        assert len(procs) == tp - 1 and all(p.is_alive() for p in procs)
    finally:
        llm.shutdown()
    assert not any(p.is_alive() for p in procs), "workers outlived shutdown()"
    assert not dist.is_initialized()
    return [o.token_ids for o in outs]


def _params():
    # greedy, and seeded sampling, which reacts to any logit change larger than rounding
    return [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
            SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=7),
            SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10, ignore_eos=True, seed=3),
            SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)]


def test_tp2_matches_single_process(tiny_qwen3_dir):
    want = _generate(tiny_qwen3_dir, 1, _params())
    assert _generate(tiny_qwen3_dir, 2, _params()) == want
    assert not mp.active_children()


@pytest.mark.slow
def test_tp4_replicated_kv_heads_matches_single_process(tiny_qwen3_dir):
    # 4 ranks over 2 kv heads: each kv head lives on two ranks
    assert _generate(tiny_qwen3_dir, 4, _params()) == _generate(tiny_qwen3_dir, 1, _params())


def test_a_second_engine_starts_after_shutdown(tiny_qwen2_dir):
    first = _generate(tiny_qwen2_dir, 2, _params())
    assert _generate(tiny_qwen2_dir, 2, _params()) == first


def test_unsplittable_model_is_rejected_before_spawning(tiny_qwen3_dir):
    with pytest.raises(ValueError, match="tensor_parallel_size=3"):
        LLM(str(tiny_qwen3_dir), device="cpu", tensor_parallel_size=3)
    assert not mp.active_children()


def test_a_dead_worker_fails_the_next_step(tiny_qwen3_dir):
    from engine.tp.workers import WorkerError

    llm = LLM(str(tiny_qwen3_dir), device="cpu", max_model_len=96, block_size=4, tensor_parallel_size=2)
    try:
        proc = llm.executor.workers.procs[0]
        proc.kill()
        proc.join()
        with pytest.raises(WorkerError, match="rank 1 exited"):
            llm.generate(PROMPTS, _params(), use_tqdm=False)
    finally:
        llm.shutdown()
    assert not mp.active_children() and not dist.is_initialized()
