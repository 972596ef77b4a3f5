"""On one GPU: an MoE engine's start-up compiles every fused-MoE launch variant (engine.moe_warmup),
so that an eager prefill of any token count afterwards compiles nothing: no new entry in the
fused-MoE kernels' Triton caches, the warm-up plan's counts, their neighbours and random counts up
to the budget alike. The tiny MoE preset (8 experts, no tuned table: the default tiles) with
random weights, in bfloat16 and with the expert counts recorded, as the held-out protocol runs."""

from __future__ import annotations

import numpy as np

from tests.kernels.gpu import needs_cuda

pytestmark = needs_cuda
BUDGET = 2048  # the tiny MoE preset's max_position_embeddings


def _compiled() -> int:
    from kernels import fused_moe, moe_align_triton, moe_route

    kernels = [moe_route._route_kernel, moe_align_triton._count_kernel, moe_align_triton._scan_kernel,
               moe_align_triton._scatter_kernel, fused_moe._grouped_gemm_kernel]
    return sum(len(entry[0]) for k in kernels for entry in k.device_caches.values())


def test_eager_prefills_after_start_up_compile_nothing():
    from engine.llm import LLM
    from engine.moe_warmup import moe_warmup_counts
    from harness.scripting import probe_plan

    llm = LLM("tiny-qwen3-moe", load_format="dummy", device="cuda", dtype="bfloat16", record_expert_counts=True,
              max_model_len=BUDGET, max_num_batched_tokens=BUDGET, gpu_memory_utilization=0.3)
    try:
        counts = moe_warmup_counts(llm.executor.runner.model, llm.executor.runner.device, BUDGET)
        assert counts and counts[0] == 1
        before = _compiled()
        rng = np.random.default_rng()
        tokens = sorted({*counts, *(c + 1 for c in counts if c < BUDGET), *(c - 1 for c in counts if c > 1),
                         *rng.integers(1, BUDGET + 1, 12).tolist()})
        for i, n in enumerate(tokens):
            plan = probe_plan(llm.executor, llm.scheduler_config, [(int(n), 0, False)], seed=i)
            plan.use_cuda_graphs = False
            llm.executor.submit(plan).result()
            assert _compiled() == before, f"an eager prefill of {n} tokens compiled a fused-MoE variant"
    finally:
        llm.executor.shutdown()
