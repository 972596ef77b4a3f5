"""Expert parallelism on CPU: each of the ranks holds num_experts / tp whole experts of the tiny MoE
model (8 experts, top-2, layer 0 dense), attention stays tensor-parallel, and the all-reduce sums
the ranks' partial outputs.

float32 throughout, so EP=2 must give TP=1's logits within rounding (rtol 1e-4, atol 1e-5: the
sum over ranks only reorders float32 additions) and TP=1's greedy tokens at every position,
teacher forced, with real gloo worker processes.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.core.expert_parallel import experts_per_rank
from engine.core.model_shapes import MODEL_SHAPES
from engine.layers.moe import MoEExperts, SparseMoE
from engine.layers.parallel import TensorParallel
from tests.engine.test_model_tp import _run, run_on_threads

NUM_TOKENS = 8
PROMPTS = [[5, 17, 300, 42, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [400, 3], list(range(100, 140))]
ENGINE = dict(device="cpu", max_model_len=96, block_size=4, max_num_batched_tokens=64)


@pytest.mark.parametrize("size", [2, 4])
def test_ep_logits_equal_tp1(tiny_qwen3_moe_dir, size):
    want, full = _run(tiny_qwen3_moe_dir)
    for rank, (got, model) in enumerate(run_on_threads(tiny_qwen3_moe_dir, size, expert_parallel=True)):
        experts = model.model.layers[1].mlp.experts
        held = 8 // size
        # whole experts at full width, the rank's own block of them
        assert tuple(experts.gate_up_proj.shape) == (held, 2 * 32, 64)
        full_experts = full.model.layers[1].mlp.experts
        torch.testing.assert_close(experts.down_proj, full_experts.down_proj[rank * held:(rank + 1) * held])
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def _greedy(model_dir, tp: int, prompts, max_tokens: int, **kw) -> list[list[int]]:
    llm = LLM(str(model_dir), tensor_parallel_size=tp, **ENGINE, **kw)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        return [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        llm.shutdown()


def test_ep2_greedy_tokens_equal_tp1_teacher_forced(tiny_qwen3_moe_dir):
    want = _greedy(tiny_qwen3_moe_dir, 1, PROMPTS, NUM_TOKENS)
    # every prefix of TP=1's output, one token each: EP=2 must pick TP=1's next token everywhere
    prefixes = [p + w[:j] for p, w in zip(PROMPTS, want) for j in range(NUM_TOKENS)]
    forced = _greedy(tiny_qwen3_moe_dir, 2, prefixes, 1, expert_parallel=True)
    assert [t[0] for t in forced] == [t for w in want for t in w]


def test_expert_count_not_divisible_is_refused():
    f = lambda x: x  # noqa: E731 (never called: construction fails first)
    with pytest.raises(ValueError, match=r"num_experts=6 must be divisible by tensor_parallel_size=4"):
        MoEExperts(6, 8, 4, TensorParallel(0, 4, f, f, expert_parallel=True))


def test_engine_refuses_bad_expert_parallel_before_spawning(tiny_qwen3_moe_dir, tiny_qwen3_dir):
    with pytest.raises(ValueError, match=r"^execution.expert_parallel=true needs a mixture-of-experts model"):
        LLM(str(tiny_qwen3_dir), tensor_parallel_size=2, expert_parallel=True, **ENGINE)
    with pytest.raises(ValueError, match=r"num_experts=8 .* divisible by tensor_parallel_size=3"):
        LLM(str(tiny_qwen3_moe_dir), tensor_parallel_size=3, expert_parallel=True, **ENGINE)
    shape = MODEL_SHAPES["qwen3-30b-a3b"]
    assert experts_per_rank(shape, 4, True) == 32 and experts_per_rank(shape, 4, False) == 128


def test_foreign_pairs_add_nothing_on_the_torch_path():
    # the grouped path's stand-in id (E) contributes zero; the rest equals the reference
    from kernels.moe_reference import fused_moe_ref, grouped_moe

    g = torch.Generator().manual_seed(3)
    x, w13, w2 = torch.randn(5, 8, generator=g), torch.randn(3, 8, 8, generator=g), torch.randn(3, 8, 4, generator=g)
    ids = torch.tensor([[0, 3], [3, 3], [2, 1], [1, 0], [3, 2]])
    weights = torch.rand(5, 2, generator=g)
    kept = torch.where(ids < 3, weights, torch.zeros_like(weights))
    want = fused_moe_ref(x, w13, w2, kept, ids.clamp(max=2))
    torch.testing.assert_close(grouped_moe(x, w13, w2, weights, ids), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_layer_ranks_sum_to_the_whole_layer(fused):
    """Two expert-parallel ranks of one SparseMoE, loaded from the packed tensors, sum to the whole
    layer's output; fused: the layer's fused path, a torch stand-in taking the kernel's arguments
    (the model's expert count for the tile table, other ranks' pairs as id E / tp)."""
    from engine.layers.fused import FusedKernels
    from kernels.moe_reference import grouped_moe, route

    g = torch.Generator().manual_seed(5)
    experts, hidden, inter = 8, 16, 8
    w13, w2 = torch.randn(experts, 2 * inter, hidden, generator=g), torch.randn(experts, hidden, inter, generator=g)
    gate = torch.randn(experts, hidden, generator=g)
    x = torch.randn(11, hidden, generator=g)
    tables: list[int] = []

    def stand_in(x, w13, w2, weights, ids, table_experts):
        tables.append(table_experts)
        return grouped_moe(x, w13, w2, weights, ids)

    def layer(tp: TensorParallel) -> SparseMoE:
        moe = SparseMoE(experts, 2, hidden, inter, True, tp, reduce_output=False)
        moe.gate.weight.data.copy_(gate)
        moe.experts.load_gate_up(moe.experts.gate_up_proj, w13)
        moe.experts.load_down(moe.experts.down_proj, w2)
        if fused:
            moe.fused_kernels = FusedKernels(None, None, None, None, allow_cpu=True, fused_moe_ids=stand_in)
        return moe

    f = lambda t: t  # noqa: E731 (collectives are never called: reduce_output is off)
    weights, ids = route(x @ gate.t(), 2, True)
    want = grouped_moe(x, w13, w2, weights, ids)  # the whole layer
    with torch.no_grad():
        got = sum(layer(TensorParallel(r, 2, f, f, expert_parallel=True)).forward(x) for r in range(2))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert tables == ([8, 8] if fused else [])
