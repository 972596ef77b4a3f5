"""Expert parallelism on two GPUs (NCCL): each rank holds 4 of the tiny MoE model's 8 experts
whole, attention stays tensor-parallel. Against TP=1: float32 greedy tokens identical; bfloat16
teacher forced, every position of TP=1's greedy output within bf16 rounding of TP=1's largest
logit (as tests/engine/test_moe_tp_gpu.py checks TP=2). And the fused kernel's expert-parallel
form: pairs of another rank's experts (id E) add nothing, the rest equal the float32 reference.
"""

from __future__ import annotations

import pytest
import torch

from kernels.moe_reference import fused_moe_ref, route
from tests.engine.test_moe_tp_gpu import ENGINE, GREEDY, NUM_TOKENS, _checkpoint, _prompts
from tests.engine.tp_gpu_checks import TP1_ROUNDING, generate, teacher_forced, two_gpus

pytestmark = [pytest.mark.gpu]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("tokens", [1, 37, 600])
def test_fused_moe_skips_other_ranks_experts(dtype, tol, tokens):
    from kernels.fused_moe import fused_moe

    seed = int(torch.randint(0, 2**31 - 1, ()).item())  # fresh inputs each run; printed on failure
    gen = torch.Generator(device="cuda").manual_seed(seed)
    experts, held, hidden, inter, k = 16, 8, 128, 96, 4
    x = torch.randn(tokens, hidden, generator=gen, device="cuda").to(dtype)
    w13 = (torch.randn(held, 2 * inter, hidden, generator=gen, device="cuda") / hidden**0.5).to(dtype)
    w2 = (torch.randn(held, hidden, inter, generator=gen, device="cuda") / inter**0.5).to(dtype)
    weights, ids = route(torch.randn(tokens, experts, generator=gen, device="cuda"), k, True)
    first = held  # this rank holds experts 8..15
    local = torch.where((ids >= first) & (ids < first + held), ids - first, torch.full_like(ids, held))
    got = fused_moe(x, w13, w2, weights, local, table_experts=experts)
    kept = torch.where(local < held, weights, torch.zeros_like(weights))
    want = fused_moe_ref(x, w13, w2, kept, local.clamp(max=held - 1))
    err = float((got.float() - want).abs().max()) / (float(want.abs().max()) or 1.0)
    assert err <= tol, f"relative error {err:.2e} > {tol:.0e} (seed {seed})"


@two_gpus
def test_moe_ep2_equals_tp1_float32(tmp_path_factory):
    model_dir = _checkpoint(tmp_path_factory, "float32")
    prompts = _prompts(8)
    want = generate(model_dir, prompts, GREEDY, ENGINE, tensor_parallel_size=1)
    assert generate(model_dir, prompts, GREEDY, ENGINE, tensor_parallel_size=2, expert_parallel=True) == want


@two_gpus
def test_moe_ep2_matches_tp1_bfloat16_teacher_forced(tmp_path_factory):
    model_dir = _checkpoint(tmp_path_factory, "bfloat16")
    _, gaps, _, _ = teacher_forced(model_dir, _prompts(8, seed=1), GREEDY, NUM_TOKENS, ENGINE, expert_parallel=True)
    assert len(gaps) == 8 * NUM_TOKENS
    assert max(gaps) <= TP1_ROUNDING, max(gaps)
