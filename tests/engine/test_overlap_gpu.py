"""Overlapped steps on CUDA: step N+1 queued before step N's ids are read, its placeholder inputs
filled on the device (in the CUDA-graph static buffers for decode). Same tokens as the plain
loop, with greedy and seeded sampling, with preemption; step times from events add up."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _prompts(n: int) -> list[list[int]]:
    return [[(31 * i + 7 * j) % 400 + 3 for j in range(5 + (11 * i) % 40)] for i in range(n)]


@pytest.mark.parametrize("fused_kernels", ["triton", "off"])
def test_overlapped_steps_give_the_plain_loops_tokens_on_cuda(tiny_qwen3_dir, fused_kernels):
    prompts = _prompts(24)
    params = [SamplingParams(temperature=0.0 if i % 3 == 0 else 0.8, top_p=0.9, max_tokens=8 + i % 13,
                             seed=i, ignore_eos=True) for i in range(len(prompts))]
    outputs = {}
    for mode in (False, True):
        llm = LLM(tiny_qwen3_dir, device="cuda", dtype="float32", max_model_len=128, block_size=16,
                  num_blocks=24, max_num_seqs=16, fused_kernels=fused_kernels, async_scheduling=mode)
        assert llm.executor.info().overlaps_steps is mode
        assert llm.executor.uses_cuda_graphs
        outputs[mode] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        steps = llm.last_run.steps
        assert all(s.duration_s > 0 for s in steps)
        if mode:
            assert llm.scheduler.num_preemptions > 0
            assert sum(s.duration_s for s in steps) <= llm.last_run.makespan_s + 1e-3
        llm.shutdown()
    assert outputs[True] == outputs[False]


def test_auto_overlaps_on_cuda(tiny_qwen3_dir):
    llm = LLM(tiny_qwen3_dir, device="cuda", max_model_len=64, block_size=16)
    try:
        assert llm.executor.info().overlaps_steps
        out = llm.generate(_prompts(3), SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True),
                           use_tqdm=False)
        assert [len(o.token_ids) for o in out] == [5, 5, 5]
    finally:
        llm.shutdown()
