"""Fused mixture-of-experts: tokens grouped by expert, two grouped GEMMs, the top-k weighted sum.

Layout (engine.layers.moe): x [T, hidden]; w13 [E, 2 * inter, hidden] (gate rows, then up rows);
w2 [E, hidden, inter]; topk_weights / topk_ids [T, k]. A (token, slot) pair is row t * k + slot.

1. moe_align: the T * k pairs sorted by expert, each expert's run padded to a multiple of
   BLOCK_M, so every BLOCK_M-row tile of the sorted list belongs to one expert. Pure torch ops
   on the device (no host sync), with a static size for a given T: T * k + E * (BLOCK_M - 1).
2. gate/up GEMM: per tile, the tile's token rows of x times the expert's gate and up rows,
   silu(gate) * up in registers, written to the pair's row of h [T * k, inter].
3. down GEMM: per tile, h rows times the expert's w2, scaled by the pair's router weight,
   written to the pair's row of y [T * k, hidden].
4. y.view(T, k, hidden).sum(1).

Padding rows of a tile point past the last pair and are masked; tiles past the padded total
return at once. No shape depends on the routing, so the whole call is CUDA-graph capturable.
Accumulation in float32; float32 inputs use IEEE products (no TF32), so the tests hold the
kernel to the float32 reference tightly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.validation import SUPPORTED_DTYPES


def block_m_for(num_pairs: int, num_experts: int) -> int:
    """Tile height: small when few pairs land on each expert (decode), taller for prefill."""
    per_expert = num_pairs / num_experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] -> (sorted pair ids [P] int32, padding = T * k; expert of each tile [P / block_m]
    int32; padded pair count [1] int32), P = T * k + E * (block_m - 1) rounded up to block_m."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync to size its output
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    sorted_experts, order = torch.sort(flat, stable=True)
    first_of_expert = torch.cumsum(counts, 0) - counts
    rank_in_expert = torch.arange(n, device=flat.device) - first_of_expert[sorted_experts]
    capacity = triton.cdiv(n + num_experts * (block_m - 1), block_m) * block_m
    sorted_ids = torch.full((capacity,), n, dtype=torch.int32, device=flat.device)
    sorted_ids.scatter_(0, starts[sorted_experts] + rank_in_expert, order.to(torch.int32))
    tile_starts = torch.arange(0, capacity, block_m, device=flat.device)
    tile_expert = torch.searchsorted(ends, tile_starts, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_ids, tile_expert, ends[-1:].to(torch.int32)


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, w_ptr, out_ptr, pair_weight_ptr, sorted_ids_ptr, tile_expert_ptr, num_padded_ptr,
    num_pairs, n_out, k_in, a_row_div, up_offset,
    stride_am, stride_we, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GATED: tl.constexpr, WEIGHTED: tl.constexpr, IEEE: tl.constexpr,
):
    """out[pair, n] = sum_k a[pair // a_row_div, k] * w[expert, n, k] for the tile's pairs; GATED
    also takes the up rows (n + up_offset) and writes silu(gate) * up; WEIGHTED scales by the pair's
    router weight. w's last dimension is contiguous."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(tile_expert_ptr + pid_m).to(tl.int64)
    pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    pair_ok = pairs < num_pairs
    rows = (pairs // a_row_div).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_out
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # [K, N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_in, BLOCK_K):
        k_ok = offs_k < k_in - k0
        a = tl.load(a_ptrs, mask=pair_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
        if GATED:
            w_up = tl.load(w_ptrs + up_offset * stride_wn, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if IEEE:
                acc_up = tl.dot(a, w_up, acc_up, input_precision="ieee")
            else:
                acc_up = tl.dot(a, w_up, acc_up)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if GATED:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up
    if WEIGHTED:
        acc = acc * tl.load(pair_weight_ptr + pairs, mask=pair_ok, other=0.0).to(tl.float32)[:, None]
    out_ptrs = out_ptr + pairs[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=pair_ok[:, None] & n_ok[None, :])


def _check(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
           topk_ids: torch.Tensor) -> None:
    if x.dtype not in SUPPORTED_DTYPES or w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise TypeError(f"fused_moe: x, w13, w2 must share one dtype of {SUPPORTED_DTYPES}, got "
                        f"{x.dtype}, {w13.dtype}, {w2.dtype}")
    e, two_inter, hidden = w13.shape
    if x.dim() != 2 or x.shape[1] != hidden or two_inter % 2 or tuple(w2.shape) != (e, hidden, two_inter // 2):
        raise ValueError(f"fused_moe: shapes x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)} "
                         "are not [T, H], [E, 2I, H], [E, H, I]")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"fused_moe: topk_ids {tuple(topk_ids.shape)} and topk_weights "
                         f"{tuple(topk_weights.shape)} must both be [T, k] with T = {x.shape[0]}")
    for name, t in (("x", x), ("w13", w13), ("w2", w2)):
        if not t.is_contiguous():
            raise ValueError(f"fused_moe: {name} must be contiguous")


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
    """x [T, hidden] -> [T, hidden] in x's dtype: sum over the k slots of weight * expert(x)."""
    _check(x, w13, w2, topk_weights, topk_ids)
    topk_weights = topk_weights.contiguous()
    t, k = topk_ids.shape
    num_experts, hidden, inter = w2.shape
    out = torch.empty_like(x)
    if t == 0:
        return out
    block_m = block_m_for(t * k, num_experts)
    sorted_ids, tile_expert, num_padded = moe_align(topk_ids, num_experts, block_m)
    tiles = tile_expert.numel()
    ieee = x.dtype == torch.float32
    h = torch.empty((t * k, inter), dtype=x.dtype, device=x.device)
    block_n, block_k = 64, 64
    _grouped_gemm_kernel[(tiles, triton.cdiv(inter, block_n))](
        x, w13, h, topk_weights, sorted_ids, tile_expert, num_padded,
        t * k, inter, hidden, k, inter,
        x.stride(0), w13.stride(0), w13.stride(1), h.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GATED=True, WEIGHTED=False, IEEE=ieee, num_warps=4,
    )
    y = torch.empty((t * k, hidden), dtype=x.dtype, device=x.device)
    _grouped_gemm_kernel[(tiles, triton.cdiv(hidden, block_n))](
        h, w2, y, topk_weights, sorted_ids, tile_expert, num_padded,
        t * k, hidden, inter, 1, 0,
        h.stride(0), w2.stride(0), w2.stride(1), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GATED=False, WEIGHTED=True, IEEE=ieee, num_warps=4,
    )
    torch.sum(y.view(t, k, hidden), dim=1, out=out)
    return out
