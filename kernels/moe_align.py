"""Alignment of a fused-MoE call's (token, slot) pairs into one-expert tiles, in torch ops.

The reference for the Triton version (kernels.moe_align_triton, which the fused kernel runs) and
the CPU-testable statement of the layout. Pure device-side ops (no host sync), with sizes that
depend only on T * k, E and BLOCK_M, so a CUDA graph can capture it.
"""

from __future__ import annotations

import torch

CHUNK = 64  # pairs per program at most; a [CHUNK, E_PAD] int32 one-hot stays in registers at E <= 256
TILES = 16  # tile-map entries per program: covers all tiles while block_m >= CHUNK / TILES
SMALL_PROGRAMS = 128  # up to this many chunks the scatter sums the table itself (decode sizes)


def align_capacity(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Static length of the sorted pair list: every expert's run padded to a multiple of block_m,
    at worst block_m - 1 padding rows per expert, rounded up to whole tiles."""
    return -(-(num_pairs + num_experts * (block_m - 1)) // block_m) * block_m


def num_programs(num_pairs: int, num_experts: int, block_m: int, chunk: int) -> int:
    """Programs of kernels.moe_align_triton's count and scatter kernels: enough for every pair
    chunk, the fill of the sorted list and the tile map."""
    if block_m * TILES < chunk:
        raise ValueError(f"moe_align_triton: block_m={block_m} must be at least {-(-chunk // TILES)}")
    return -(-align_capacity(num_pairs, num_experts, block_m) // chunk)


def scans(programs: int) -> bool:
    """Whether the Triton alignment of `programs` chunks runs its scan kernel (a compile-time
    switch of its scatter kernel)."""
    return programs > SMALL_PROGRAMS


def scanned(num_pairs: int, num_experts: int, block_m: int, chunk: int) -> bool:
    """scans() for a call of num_pairs (token, slot) pairs."""
    return scans(num_programs(num_pairs, num_experts, block_m, chunk))


def tokens_per_program(top_k: int) -> int:
    """Tokens per program of kernels.moe_route's router kernel: its pairs are one chunk."""
    return max(1, CHUNK // top_k)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] -> (sorted pair ids [P] int32, padding = T * k; expert of each tile [P / block_m]
    int32; padded pair count [1] int32), P = align_capacity(T * k, E, block_m). Pairs of one expert
    keep their order (pair t * k + slot), so the layout is unique."""
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
    capacity = align_capacity(n, num_experts, block_m)
    sorted_ids = torch.full((capacity,), n, dtype=torch.int32, device=flat.device)
    sorted_ids.scatter_(0, starts[sorted_experts] + rank_in_expert, order.to(torch.int32))
    tile_starts = torch.arange(0, capacity, block_m, device=flat.device)
    tile_expert = torch.searchsorted(ends, tile_starts, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_ids, tile_expert, ends[-1:].to(torch.int32)
