"""The router kernel (kernels.moe_route) and the layer from the router's logits
(kernels.fused_moe.fused_moe_routed) on CUDA, against float32 references with fresh random inputs
(tests/kernels/moe_cases.py): decode to prefill sizes (past SMALL_PROGRAMS chunks the alignment
takes its scan kernel), Qwen3-30B-A3B's 128 experts top-8 and other shapes, both normalisations;
then inside a CUDA graph replayed with new logits and new padding rows, the count record
accumulating across replays."""

from __future__ import annotations

import pytest
import torch

from tests.kernels import moe_cases as cases
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import fresh_seed

pytestmark = needs_cuda


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens, experts, top_k", [(1, 8, 2), (7, 8, 2), (140, 128, 8), (256, 128, 8),
                                                    (999, 60, 6), (3000, 128, 8), (16384, 128, 8), (33, 256, 8)])
@pytest.mark.parametrize("block_m", [16, 64])
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_align_matches_float32_reference(dtype, tokens, experts, top_k, block_m, renormalize):
    cases.check_route_align("cuda", dtype, tokens, experts, top_k, block_m, renormalize, fresh_seed())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("tokens, experts, top_k, hidden, inter", [(1, 8, 2, 256, 96), (37, 128, 8, 2048, 768),
                                                                   (64, 128, 8, 512, 384), (300, 64, 6, 256, 96)])
@pytest.mark.parametrize("summed", [True, False])
def test_fused_moe_routed_matches_float32_reference(dtype, tokens, experts, top_k, hidden, inter, summed):
    cases.check_fused_moe_routed("cuda", dtype, tokens, experts, top_k, hidden, inter, True, summed, fresh_seed())


def test_routed_layer_replays_in_a_cuda_graph_and_records_real_tokens_only():
    from kernels.fused_moe import fused_moe_routed
    from kernels.moe_reference import fused_moe_ref, route_topk_first

    seed = fresh_seed()
    gen = torch.Generator(device="cuda").manual_seed(seed)
    t, e, k, hidden, inter = 48, 128, 8, 256, 128
    w13 = (torch.randn(e, 2 * inter, hidden, generator=gen, device="cuda") / hidden**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, hidden, inter, generator=gen, device="cuda") / inter**0.5).to(torch.bfloat16)
    x = torch.zeros(t, hidden, dtype=torch.bfloat16, device="cuda")
    logits = torch.zeros(t, e, dtype=torch.bfloat16, device="cuda")
    slots = torch.zeros(t, dtype=torch.int64, device="cuda")
    record = torch.zeros(e, dtype=torch.int32, device="cuda")
    fused_moe_routed(x, logits, w13, w2, k, True, record=(record, slots))  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe_routed(x, logits, w13, w2, k, True, record=(record, slots))
    record.zero_()
    want_record = torch.zeros(e, dtype=torch.int64, device="cuda")
    for step in range(3):
        real = 48 - 11 * step  # the rest are padding rows: slot -1
        x.copy_(torch.randn(t, hidden, generator=gen, device="cuda"))
        logits.copy_(torch.stack([torch.randperm(e, generator=gen, device="cuda") for _ in range(t)]) * (4.0 / e))
        slots.copy_(torch.where(torch.arange(t, device="cuda") < real, torch.arange(t, device="cuda"), -1))
        graph.replay()
        weights, ids = route_topk_first(logits, k, True)
        want = fused_moe_ref(x, w13, w2, weights, ids)
        err = float((out.float() - want).abs().max()) / float(want.abs().max())
        assert err <= cases.TOLERANCE[torch.bfloat16], f"step {step}: relative error {err:.2e} (seed {seed})"
        want_record += torch.bincount(ids[:real].reshape(-1), minlength=e)
        assert torch.equal(record.long(), want_record), f"step {step}: record differs (seed {seed})"
