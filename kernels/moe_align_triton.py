"""kernels.moe_align in Triton launches instead of about twenty small torch kernels per MoE layer.

Same outputs, bit for bit (tests/kernels/test_moe_align.py), same static sizes, no host sync.
The pairs are cut into chunks of `chunk` pairs (at most CHUNK); program c of

1. a count kernel: writes chunk c's per-expert pair counts to row c of a [programs, E_PAD] table,
   and fills `chunk` slots of the sorted list with the padding value T * k. Here _count_kernel,
   over given expert ids; kernels.moe_route's router kernel does the same while it picks them;
2. when there are more than SMALL_PROGRAMS chunks (prefill), _scan_kernel: per expert, the
   exclusive prefix of the counts over chunks (how many of the expert's pairs earlier chunks
   hold) and the total, in one pass over the table;
3. _scatter_kernel: takes each expert's total and the chunk's prefix (from the scan, or, for few
   chunks, by summing the table's rows itself: quadratic in the chunk count, so only while that is
   small, where the extra launch would cost more), pads the totals to block_m and scans them to
   each expert's first slot, ranks its chunk's pairs among those of the same expert (a cumsum
   over a one-hot [CHUNK, E_PAD] matrix), and writes each pair id to its slot; it also writes
   TILES entries of the tile -> expert map, and program 0 the padded total.

Launch boundaries order the fill before the scatter; pairs keep their order within an expert, as
the torch version's stable sort does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.moe_align import CHUNK, SMALL_PROGRAMS, TILES, align_capacity, num_programs, scans

__all__ = ["CHUNK", "SMALL_PROGRAMS", "TILES", "align_buffers", "moe_align_triton", "num_programs", "scatter"]
ROWS = 16  # count-table rows summed per loop step (few chunks)
# NOTE: integer arguments that follow the token count are not specialised (do_not_specialize):
# Triton compiles a variant per combination of "divisible by 16" and "equal to 1" over them, so an
# eager step whose counts met a new combination compiled for 0.3-0.5 s in the middle of a run
# (experiments/fidelity/h100_30b_r5, docs/moe-warmup.md). Only the constexprs (BLOCK_M, SCANNED)
# remain per call, and the engine's start-up runs each of them (engine.moe_warmup).
SCAN_ROWS = 1024  # count-table rows one scan step reads per expert

Aligned = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@triton.jit(do_not_specialize=["num_pairs", "capacity"])
def _count_kernel(ids_ptr, counts_ptr, sorted_ids_ptr, num_pairs, capacity, chunk,
                  E_PAD: tl.constexpr, CHUNK_PAD: tl.constexpr):
    pid = tl.program_id(0)
    local = tl.arange(0, CHUNK_PAD)
    offs = pid * chunk + local
    tl.store(sorted_ids_ptr + offs, tl.zeros((CHUNK_PAD,), dtype=tl.int32) + num_pairs,
             mask=(local < chunk) & (offs < capacity))
    ids = tl.load(ids_ptr + offs, mask=(local < chunk) & (offs < num_pairs), other=-1)
    experts = tl.arange(0, E_PAD)
    hits = (ids[:, None] == experts[None, :]).to(tl.int32)
    tl.store(counts_ptr + pid * E_PAD + experts, tl.sum(hits, axis=0))


@triton.jit(do_not_specialize=["num_rows"])
def _scan_kernel(counts_ptr, before_ptr, totals_ptr, num_rows, E_PAD: tl.constexpr, SCAN_ROWS: tl.constexpr):
    """Program e: column e of the count table -> its exclusive prefix over rows, and its sum."""
    expert = tl.program_id(0)
    carry = tl.sum(tl.zeros((1,), dtype=tl.int32), axis=0)
    for r0 in range(0, num_rows, SCAN_ROWS):
        rows = r0 + tl.arange(0, SCAN_ROWS)
        ok = rows < num_rows
        c = tl.load(counts_ptr + rows * E_PAD + expert, mask=ok, other=0)
        tl.store(before_ptr + rows * E_PAD + expert, tl.cumsum(c, axis=0) - c + carry, mask=ok)
        carry += tl.sum(c, axis=0)
    tl.store(totals_ptr + expert, carry)


@triton.jit(do_not_specialize=["num_pairs", "num_rows", "num_tiles"])
def _scatter_kernel(ids_ptr, counts_ptr, before_ptr, totals_ptr, sorted_ids_ptr, tile_expert_ptr, num_padded_ptr,
                    num_pairs, num_rows, num_tiles, num_experts, chunk,
                    BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, CHUNK_PAD: tl.constexpr,
                    TILES: tl.constexpr, ROWS: tl.constexpr, SCANNED: tl.constexpr):
    pid = tl.program_id(0)
    experts = tl.arange(0, E_PAD)
    if SCANNED:
        total = tl.load(totals_ptr + experts)
        before = tl.load(before_ptr + pid * E_PAD + experts)
    else:
        total = tl.zeros((E_PAD,), dtype=tl.int32)
        before = tl.zeros((E_PAD,), dtype=tl.int32)
        for r0 in range(0, num_rows, ROWS):
            rows = r0 + tl.arange(0, ROWS)
            c = tl.load(counts_ptr + rows[:, None] * E_PAD + experts[None, :], mask=(rows < num_rows)[:, None],
                        other=0)
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
    local = tl.arange(0, CHUNK_PAD)
    offs = pid * chunk + local
    ok = (local < chunk) & (offs < num_pairs)
    ids = tl.load(ids_ptr + offs, mask=ok, other=-1)
    hits = (ids[:, None] == experts[None, :]).to(tl.int32)
    rank = tl.sum((tl.cumsum(hits, axis=0) - hits) * hits, axis=1)
    first = tl.sum(hits * (starts + before)[None, :], axis=1)
    tl.store(sorted_ids_ptr + first + rank, offs.to(tl.int32), mask=ok)


def expert_pad(num_experts: int) -> int:
    return max(16, triton.next_power_of_2(num_experts))


def align_buffers(num_pairs: int, num_experts: int, block_m: int, chunk: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The count table [programs, E_PAD] and the sorted list a count kernel writes into."""
    programs = num_programs(num_pairs, num_experts, block_m, chunk)
    counts = torch.empty((programs, expert_pad(num_experts)), dtype=torch.int32, device=device)
    sorted_ids = torch.empty((align_capacity(num_pairs, num_experts, block_m),), dtype=torch.int32, device=device)
    return counts, sorted_ids


def scatter(flat_ids: torch.Tensor, counts: torch.Tensor, sorted_ids: torch.Tensor, num_experts: int,
            block_m: int, chunk: int) -> Aligned:
    """Steps 2 and 3 of the module docstring, after a count kernel filled counts and sorted_ids."""
    n = flat_ids.numel()
    programs, e_pad = counts.shape
    capacity = sorted_ids.numel()
    device = flat_ids.device
    tile_expert = torch.empty((capacity // block_m,), dtype=torch.int32, device=device)
    num_padded = torch.empty((1,), dtype=torch.int32, device=device)
    scanned = scans(programs)
    before, totals = counts, num_padded  # unread without the scan
    if scanned:
        before = torch.empty_like(counts)
        totals = torch.empty((e_pad,), dtype=torch.int32, device=device)
        _scan_kernel[(e_pad,)](counts, before, totals, programs, E_PAD=e_pad, SCAN_ROWS=SCAN_ROWS, num_warps=4)
    _scatter_kernel[(programs,)](flat_ids, counts, before, totals, sorted_ids, tile_expert, num_padded,
                                 n, programs, capacity // block_m, num_experts, chunk,
                                 BLOCK_M=block_m, E_PAD=e_pad, CHUNK_PAD=triton.next_power_of_2(chunk),
                                 TILES=TILES, ROWS=ROWS, SCANNED=scanned, num_warps=4)
    return sorted_ids, tile_expert, num_padded


def moe_align_triton(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Aligned:
    """kernels.moe_align.moe_align's outputs (topk_ids contiguous [T, k], int32 or int64)."""
    flat = topk_ids.reshape(-1)
    n = flat.numel()
    counts, sorted_ids = align_buffers(n, num_experts, block_m, CHUNK, flat.device)
    _count_kernel[(counts.shape[0],)](flat, counts, sorted_ids, n, sorted_ids.numel(), CHUNK,
                                      E_PAD=counts.shape[1], CHUNK_PAD=CHUNK, num_warps=4)
    return scatter(flat, counts, sorted_ids, num_experts, block_m, CHUNK)
