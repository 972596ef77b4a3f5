"""kernels.moe_align in two Triton launches instead of about twenty small torch kernels per MoE layer.

Same outputs, bit for bit (tests/kernels/test_moe_align.py), same static sizes, no host sync.
The pairs are cut into chunks of CHUNK; program c of

1. _count_kernel: writes chunk c's per-expert pair counts to row c of a [chunks, E_PAD] table, and
   fills its CHUNK slots of the sorted list with the padding value T * k;
2. _scatter_kernel: sums the table (all rows: each expert's total; rows before c: how many of the
   expert's pairs earlier chunks hold), pads the totals to block_m and scans them to each expert's
   first slot, ranks its chunk's pairs among those of the same expert (a cumsum over a one-hot
   [CHUNK, E_PAD] matrix), and writes each pair id to its slot; it also writes TILES entries of
   the tile -> expert map, and program 0 the padded total.

The launch boundary orders the fill before the scatter; pairs keep their order within an expert,
as the torch version's stable sort does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.moe_align import align_capacity

CHUNK = 64  # pairs per program; a [CHUNK, E_PAD] int32 one-hot stays in registers at E <= 256
TILES = 16  # tile-map entries per program: covers all tiles while block_m >= CHUNK / TILES
ROWS = 16  # count-table rows summed per loop step


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, sorted_ids_ptr, num_pairs, capacity,
                  E_PAD: tl.constexpr, CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    tl.store(sorted_ids_ptr + offs, tl.zeros((CHUNK,), dtype=tl.int32) + num_pairs, mask=offs < capacity)
    ids = tl.load(ids_ptr + offs, mask=offs < num_pairs, other=-1)
    experts = tl.arange(0, E_PAD)
    hits = (ids[:, None] == experts[None, :]).to(tl.int32)
    tl.store(counts_ptr + pid * E_PAD + experts, tl.sum(hits, axis=0))


@triton.jit
def _scatter_kernel(ids_ptr, counts_ptr, sorted_ids_ptr, tile_expert_ptr, num_padded_ptr,
                    num_pairs, num_rows, num_tiles, num_experts,
                    BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr,
                    TILES: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0)
    experts = tl.arange(0, E_PAD)
    total = tl.zeros((E_PAD,), dtype=tl.int32)
    before = tl.zeros((E_PAD,), dtype=tl.int32)
    for r0 in range(0, num_rows, ROWS):
        rows = r0 + tl.arange(0, ROWS)
        c = tl.load(counts_ptr + rows[:, None] * E_PAD + experts[None, :], mask=(rows < num_rows)[:, None], other=0)
        total += tl.sum(c, axis=0)
        before += tl.sum(tl.where((rows < pid)[:, None], c, 0), axis=0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    if pid == 0:
        tl.store(num_padded_ptr, tl.sum(padded, axis=0))
    # a tile's expert: how many experts end at or before its first slot (clamped: tiles past the end)
    tiles = pid * TILES + tl.arange(0, TILES)
    ended = tl.sum((ends[None, :] <= (tiles * BLOCK_M)[:, None]).to(tl.int32), axis=1)
    tl.store(tile_expert_ptr + tiles, tl.minimum(ended, num_experts - 1), mask=tiles < num_tiles)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    ok = offs < num_pairs
    ids = tl.load(ids_ptr + offs, mask=ok, other=-1)
    hits = (ids[:, None] == experts[None, :]).to(tl.int32)
    rank = tl.sum((tl.cumsum(hits, axis=0) - hits) * hits, axis=1)
    first = tl.sum(hits * (starts + before)[None, :], axis=1)
    tl.store(sorted_ids_ptr + first + rank, offs.to(tl.int32), mask=ok)


def moe_align_triton(topk_ids: torch.Tensor, num_experts: int, block_m: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kernels.moe_align.moe_align's outputs from two Triton launches (topk_ids contiguous [T, k])."""
    if block_m * TILES < CHUNK:
        raise ValueError(f"moe_align_triton: block_m={block_m} must be at least {CHUNK // TILES}")
    flat = topk_ids.reshape(-1)
    n = flat.numel()
    e_pad = max(16, triton.next_power_of_2(num_experts))
    capacity = align_capacity(n, num_experts, block_m)
    programs = triton.cdiv(capacity, CHUNK)  # >= the pair chunks, and enough for the fill and the tile map
    device = flat.device
    counts = torch.empty((programs, e_pad), dtype=torch.int32, device=device)
    sorted_ids = torch.empty((capacity,), dtype=torch.int32, device=device)
    tile_expert = torch.empty((capacity // block_m,), dtype=torch.int32, device=device)
    num_padded = torch.empty((1,), dtype=torch.int32, device=device)
    _count_kernel[(programs,)](flat, counts, sorted_ids, n, capacity, E_PAD=e_pad, CHUNK=CHUNK, num_warps=4)
    _scatter_kernel[(programs,)](flat, counts, sorted_ids, tile_expert, num_padded,
                                 n, programs, capacity // block_m, num_experts,
                                 BLOCK_M=block_m, E_PAD=e_pad, CHUNK=CHUNK, TILES=TILES, ROWS=ROWS, num_warps=4)
    return sorted_ids, tile_expert, num_padded
