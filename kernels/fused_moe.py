"""Fused mixture-of-experts: tokens grouped by expert, two grouped GEMMs, the top-k weighted sum.

Layout (engine.layers.moe): x [T, hidden]; w13 [E, 2 * inter, hidden] (gate rows, then up rows);
w2 [E, hidden, inter]; topk_weights / topk_ids [T, k]. A (token, slot) pair is row t * k + slot.

1. moe_align: the T * k pairs sorted by expert, each expert's run padded to a multiple of
   BLOCK_M, so every BLOCK_M-row tile of the sorted list belongs to one expert (Triton launches,
   kernels.moe_align_triton; kernels.moe_align is the torch statement of the same layout). No host
   sync, a static size for a given T: T * k + E * (BLOCK_M - 1), tile-rounded. fused_moe_routed
   starts from the router's logits instead: kernels.moe_route picks the top-k and counts the pairs
   for the alignment in the same launch.
2. gate/up GEMM: per tile, the tile's token rows of x times the expert's gate and up rows,
   silu(gate) * up in registers, written to the pair's row of h [T * k, inter].
3. down GEMM: per tile, h rows times the expert's w2, scaled by the pair's router weight,
   written to the pair's row of y [T * k, hidden].
4. y.view(T, k, hidden).sum(1): a plain reduction, the weights being applied in step 3; the
   engine leaves it to the next RMSNorm, which adds the k rows as it reads them.

Padding rows of a tile point past the last pair and are masked; tiles past the padded total
return at once. No shape depends on the routing, so the whole call is CUDA-graph capturable.
Tiles (BLOCK_M, and each GEMM's BLOCK_N, BLOCK_K, warps, stages) come from a tuned table per
token count (kernels.moe_configs), else fixed defaults. Accumulation in float32; float32 inputs
use IEEE products (no TF32), so the tests hold the kernel to the float32 reference tightly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.moe_align import moe_align
from kernels.moe_align_triton import moe_align_triton
from kernels.moe_configs import GemmTiles, MoeTiles, block_m_for, tiles_for
from kernels.validation import SUPPORTED_DTYPES

__all__ = ["block_m_for", "fused_moe", "fused_moe_routed", "moe_align", "moe_align_triton"]
ALIGNS = {"triton": moe_align_triton, "torch": moe_align}


@triton.jit(do_not_specialize=["num_pairs"])  # one compile for every T
def _grouped_gemm_kernel(
    a_ptr, w_ptr, out_ptr, pair_weight_ptr, sorted_ids_ptr, tile_expert_ptr, num_padded_ptr,
    num_pairs, n_out, k_in, a_row_div, up_offset, num_experts,
    stride_am, stride_we, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GATED: tl.constexpr, WEIGHTED: tl.constexpr, IEEE: tl.constexpr,
):
    """out[pair, n] = sum_k a[pair // a_row_div, k] * w[expert, n, k] for the tile's pairs; GATED
    also takes the up rows (n + up_offset) and writes silu(gate) * up; WEIGHTED scales by the pair's
    router weight. w's last dimension is contiguous. Tiles of expert num_experts (expert
    parallelism's stand-in for experts other ranks hold) write nothing."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(tile_expert_ptr + pid_m).to(tl.int64)
    if expert >= num_experts:  # expert parallelism: the tile's experts are another rank's
        return
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


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, topk_weights: torch.Tensor,
                 aligned: tuple[torch.Tensor, torch.Tensor, torch.Tensor], block_m: int, tiles: GemmTiles,
                 gated: bool) -> None:
    """One of the two GEMMs into out: gate/up (gated: a is x, a row per token) or down (a is h, a
    row per pair, scaled by the router weight)."""
    sorted_ids, tile_expert, num_padded = aligned
    num_pairs, n_out = out.shape
    stages = {} if tiles.num_stages is None else {"num_stages": tiles.num_stages}
    _grouped_gemm_kernel[(tile_expert.numel(), triton.cdiv(n_out, tiles.block_n))](
        a, w, out, topk_weights, sorted_ids, tile_expert, num_padded,
        num_pairs, n_out, a.shape[1], num_pairs // a.shape[0], n_out if gated else 0, w.shape[0],
        a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GATED=gated, WEIGHTED=not gated,
        IEEE=a.dtype == torch.float32, num_warps=tiles.num_warps, **stages,
    )


def device_name(device: torch.device) -> str:
    """The name tuned tables are keyed by: the CUDA device's, "cpu" elsewhere (the interpreter)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def call_tiles(x: torch.Tensor, w2: torch.Tensor, top_k: int, tiles: MoeTiles | None,
               table_experts: int | None = None) -> MoeTiles:
    """tiles, or the tuned table's for this call's token count (kernels.moe_configs). table_experts:
    the model's expert count where this rank holds fewer (expert parallelism: its experts see the
    rows per expert of the whole layer, so the whole layer's table fits them)."""
    if tiles is not None:
        return tiles
    num_experts, _, inter = w2.shape
    return tiles_for(x.shape[0], top_k, table_experts or num_experts, inter, str(x.dtype).removeprefix("torch."),
                     device_name(x.device))


def experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
            aligned: tuple[torch.Tensor, torch.Tensor, torch.Tensor], tiles: MoeTiles, top_k: int,
            foreign: bool = False) -> torch.Tensor:
    """Both grouped GEMMs over aligned pairs -> [T, k, hidden]: each pair's expert output times its
    router weight, in x's dtype; the caller sums over k. foreign: some pairs are another rank's
    (expert id E), which the GEMMs skip; their rows are zero."""
    t = x.shape[0]
    _, hidden, inter = w2.shape
    h = torch.empty((t * top_k, inter), dtype=x.dtype, device=x.device)
    grouped_gemm(x, w13, h, topk_weights, aligned, tiles.block_m, tiles.gate_up, gated=True)
    y = (torch.zeros if foreign else torch.empty)((t * top_k, hidden), dtype=x.dtype, device=x.device)
    grouped_gemm(h, w2, y, topk_weights, aligned, tiles.block_m, tiles.down, gated=False)
    return y.view(t, top_k, hidden)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, tiles: MoeTiles | None = None, align: str = "triton",
              table_experts: int | None = None) -> torch.Tensor:
    """x [T, hidden] -> [T, hidden] in x's dtype: sum over the k slots of weight * expert(x). tiles:
    None looks them up for T (kernels.moe_configs); align: "triton" or "torch" (same layout).
    table_experts (expert parallelism): w13 and w2 hold this rank's E of the model's table_experts
    experts, and an id equal to E marks a pair another rank computes: it adds nothing here."""
    _check(x, w13, w2, topk_weights, topk_ids)
    if align not in ALIGNS:
        raise ValueError(f"fused_moe: align={align!r} is not one of {sorted(ALIGNS)}")
    t, k = topk_ids.shape
    if t == 0:
        return torch.empty_like(x)
    tiles = call_tiles(x, w2, k, tiles, table_experts)
    foreign = table_experts is not None
    # the foreign pairs form one more expert's run, whose tiles the GEMMs skip
    aligned = ALIGNS[align](topk_ids.contiguous(), w2.shape[0] + foreign, tiles.block_m)
    return experts(x, w13, w2, topk_weights.contiguous(), aligned, tiles, k, foreign).sum(dim=1)


def fused_moe_routed(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                     top_k: int, renormalize: bool, tiles: MoeTiles | None = None,
                     record: tuple[torch.Tensor, torch.Tensor] | None = None, summed: bool = True) -> torch.Tensor:
    """The whole layer from the router's logits [T, E]: routing, top-k and the alignment in
    kernels.moe_route (two or three launches), the two GEMMs, then the sum over k: [T, hidden];
    summed=False leaves it to the caller, [T, k, hidden] (an RMSNorm that adds the k terms as it
    reads them: kernels.rmsnorm.add_rms_norm). record: kernels.moe_route.route_align's."""
    from kernels.moe_route import route_align

    t = x.shape[0]
    if router_logits.shape != (t, w2.shape[0]):
        raise ValueError(f"fused_moe_routed: router_logits {tuple(router_logits.shape)} must be [T, E] = "
                         f"[{t}, {w2.shape[0]}]")
    if t == 0:
        return torch.empty_like(x) if summed else x.new_empty((0, top_k, x.shape[1]))
    tiles = call_tiles(x, w2, top_k, tiles)
    weights, ids, aligned = route_align(router_logits, top_k, renormalize, tiles.block_m, record)
    _check(x, w13, w2, weights, ids)
    y = experts(x, w13, w2, weights, aligned, tiles, top_k)
    return y.sum(dim=1) if summed else y
