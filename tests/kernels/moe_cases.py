"""Checks of the MoE routing kernels against float32 references with fresh random inputs, shared by
the CUDA tests (tests/kernels/test_moe_route.py) and Triton's CPU interpreter (interpret_fused.py).

- check_route_align: kernels.moe_route.route_align against kernels.moe_reference.route_topk_first
  (float32): per slot the same logit value (ties in bf16 logits may pick either of two equal
  experts; the kernel takes the lower id), weights within float32 rounding, k distinct ids per
  token, the alignment equal bit for bit to the torch statement (kernels.moe_align) of those ids,
  and the count record: each expert's (token, slot) choices of the tokens whose slot is >= 0.
- check_fused_moe_routed: the whole layer from the logits against kernels.moe_reference.fused_moe_ref
  on the reference's routing, summed or left [T, k, hidden] for the norm to sum; logits are a
  random permutation per token, so no tie can make the two routings differ.
"""

from __future__ import annotations

import torch

TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def check_route_align(device: str, dtype: torch.dtype, tokens: int, experts: int, top_k: int, block_m: int,
                      renormalize: bool, seed: int) -> None:
    from kernels.moe_align import moe_align
    from kernels.moe_reference import route_topk_first
    from kernels.moe_route import route_align

    gen = torch.Generator().manual_seed(seed)
    logits = (2.0 * torch.randn(tokens, experts, generator=gen)).to(dtype).to(device)
    slots = torch.randint(-1, 1000, (tokens,), generator=gen).to(device)  # -1: a graph's padding row
    record = torch.zeros(experts, dtype=torch.int32, device=device)
    weights, ids, aligned = route_align(logits, top_k, renormalize, block_m, (record, slots))
    what = f"route_align T={tokens} E={experts} k={top_k} {dtype} renormalize={renormalize} seed {seed}"
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (tokens, top_k), what
    want_weights, want_ids = route_topk_first(logits, top_k, renormalize)
    got_values = logits.float().gather(1, ids.long())
    assert torch.equal(got_values, logits.float().gather(1, want_ids)), what + ": chosen logits differ"
    if tokens:
        assert bool((ids.sort(dim=1).values.diff(dim=1) > 0).all()), what + ": an expert chosen twice"
    torch.testing.assert_close(weights, want_weights, rtol=2e-6, atol=1e-7, msg=what)
    for name, got, want in zip(("sorted_ids", "tile_expert", "num_padded"), aligned,
                               moe_align(ids.long(), experts, block_m)):
        assert torch.equal(got, want), f"{what}: {name} differs from the torch alignment"
    real = ids[slots >= 0].long().reshape(-1)
    want_record = torch.bincount(real, minlength=experts).to(torch.int32)
    assert torch.equal(record, want_record), what + ": recorded counts differ"


def _distinct_logits(gen: torch.Generator, tokens: int, experts: int, dtype: torch.dtype) -> torch.Tensor:
    """Per token a random permutation of 0..E-1, scaled into a softmax-sized range: no two equal."""
    order = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)]) if tokens else \
        torch.empty(0, experts, dtype=torch.int64)
    return (order.float() * (4.0 / experts)).to(dtype)


def check_fused_moe_routed(device: str, dtype: torch.dtype, tokens: int, experts: int, top_k: int, hidden: int,
                           inter: int, renormalize: bool, summed: bool, seed: int, tiles=None) -> None:
    from kernels.fused_moe import fused_moe_routed
    from kernels.moe_reference import fused_moe_ref, route_topk_first

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(device)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(dtype).to(device)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(dtype).to(device)
    logits = _distinct_logits(gen, tokens, experts, dtype).to(device)
    got = fused_moe_routed(x, logits, w13, w2, top_k, renormalize, tiles=tiles, summed=summed)
    what = f"fused_moe_routed T={tokens} E={experts} k={top_k} {dtype} summed={summed} seed {seed}"
    assert got.dtype == dtype and got.shape == ((tokens, hidden) if summed else (tokens, top_k, hidden)), what
    weights, ids = route_topk_first(logits, top_k, renormalize)
    want = fused_moe_ref(x, w13, w2, weights, ids)
    total = got.float() if summed else got.float().sum(dim=1)
    scale = float(want.abs().max()) if tokens else 1.0
    err = float((total - want).abs().max()) / (scale or 1.0) if tokens else 0.0
    assert err <= TOLERANCE[dtype], f"{what}: relative error {err:.2e} > {TOLERANCE[dtype]:.0e}"
