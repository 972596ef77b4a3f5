"""The grid's per-step distinct experts on CUDA (harness.calibration.expert_steps): the tiny MoE
model with random weights, decode steps replayed as padded CUDA graphs (the router kernel adds the
counts inside the graph, padding rows left out) record what the same plan routes eagerly, where
hooks on the routers see the logits: the distinct experts of their top-k over the real tokens."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine import LLM
from engine.layers.moe import SparseMoE
from harness.calibration.expert_steps import ExpertTally
from harness.calibration.grid import build_plan
from kernels.moe_reference import route_topk_first

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_a_padded_graph_records_the_experts_its_real_tokens_chose():
    llm = LLM("tiny-qwen3-moe", load_format="dummy", max_model_len=1024, record_expert_counts=True,
              seed=int(torch.randint(0, 2**31 - 1, ()).item()))
    executor = llm.executor
    info = executor.info()
    assert info.graph_sizes.decode, "the engine captured no decode graphs"
    sparse = [layer.mlp for layer in executor.runner.model.model.layers if isinstance(layer.mlp, SparseMoE)]
    tally = ExpertTally.of(executor)
    assert tally is not None
    rng = np.random.default_rng(int(torch.randint(0, 2**31 - 1, ()).item()))
    for batch in (3, 5, 13):  # each padded to the next captured size
        assert batch not in info.graph_sizes.decode
        entries = [(1, int(c), True) for c in rng.integers(16, 400, size=batch)]
        plan = build_plan(entries, info.kv_cache_spec, llm.scheduler_config, rng, info.vocab_size)
        tally.begin()
        executor.execute(plan)
        executor.execute(plan)
        recorded = tally.distinct()
        seen: list[torch.Tensor] = []
        hooks = [moe.gate.register_forward_hook(lambda m, a, out, seen=seen: seen.append(out.detach().float()))
                 for moe in sparse]
        executor.execute(dataclasses.replace(plan, use_cuda_graphs=False))
        for hook in hooks:
            hook.remove()
        tally.distinct()
        by_hooks = [len(torch.unique(route_topk_first(logits[:batch], moe.top_k, moe.renormalize)[1]))
                    for logits, moe in zip(seen, sparse)]
        assert recorded == pytest.approx(float(np.mean(by_hooks)))
    llm.shutdown()
