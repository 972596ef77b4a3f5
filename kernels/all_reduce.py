"""One-shot all-reduce (sum) over GPUs that map each other's memory, for decode-sized tensors,
optionally fused with the residual add and RMSNorm that follow every row-parallel projection.

NCCL pays ~12 us of fixed cost per all-reduce on 2 x H200 (experiments/tp/h200x2_async/
all_reduce.csv), and a tensor-parallel decode step runs two per layer. Here each rank writes its
tensor straight into every peer's buffer (PyTorch symmetric memory, engine.tp.symmetric; stores
over NVLink are posted, where loads from a peer would wait a link round trip each), one flag
handshake per program says the copies have landed, and each rank sums the copies in its own
memory. One launch, one round trip over the links.

Protocol, per program p (the same p on every rank owns the same units: BLOCK-element chunks, or
rows with the norm):
1. write this rank's units into slot [s][rank] of every peer's buffer;
2. for each peer q: set flag[q][p, rank] from 0 to 1 (waits while q has not consumed the
   previous signal), then take flag[rank][p, q] from 1 to 0 (waits for q's signal);
3. sum every rank's copy in rank order (its own from the input), round to the input's dtype (the
   all-reduce's result), then either store it over the input or add the residual and normalise
   the row exactly as kernels.rmsnorm.add_rms_norm does.
The parity s alternates per call (a per-program counter kept on the device, so CUDA-graph replays
alternate too): a rank writes a peer's slot [s] again only two calls later, after a handshake the
peer can only join once it has finished reading that slot. Every rank sums the same values in
the same order, so every rank holds the same bits (tensor-parallel ranks must not drift apart).

The grid is at most MAX_PROGRAMS programs, so that all of them are resident at once: a program
spins on a peer's program with the same index, which must be running.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_PROGRAMS = 128
BLOCK = 2048  # elements a program moves per unit without the norm: 16 per thread at 4 warps


@triton.jit
def _one_shot_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    data_ptrs,  # int64 [world]: each rank's buffer, [2 parities][world sources][slot_elems]
    flag_ptrs,  # int64 [world]: each rank's int32 flags [MAX_PROGRAMS, world]
    counter_ptr,  # int32 [MAX_PROGRAMS], this rank's calls per program
    numel, unit, num_units, slot_elems, eps,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    calls = tl.load(counter_ptr + pid)
    tl.store(counter_ptr + pid, calls + 1)
    elem = x_ptr.dtype.element_ty
    parity = (calls % 2).to(tl.int64) * WORLD
    lanes = tl.arange(0, BLOCK)
    for u in range(pid, num_units, programs):
        offs = u.to(tl.int64) * unit + lanes
        mask = (lanes < unit) & (offs < numel)
        values = tl.load(x_ptr + offs, mask=mask)
        for peer in tl.static_range(WORLD):
            if peer != RANK:
                theirs = tl.load(data_ptrs + peer).to(tl.pointer_type(elem))
                theirs = tl.multiple_of(theirs + (parity + RANK) * slot_elems, 16)
                tl.store(theirs + offs, values, mask=mask)
    # every thread's stores are issued before the one thread that signals releases them to the peers
    tl.debug_barrier()
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            flag = tl.load(flag_ptrs + peer).to(tl.pointer_type(tl.int32)) + pid * WORLD + RANK
            while tl.atomic_cas(flag, 0, 1, sem="release", scope="sys") != 0:
                pass
    for peer in tl.static_range(WORLD):
        if peer != RANK:
            flag = tl.load(flag_ptrs + RANK).to(tl.pointer_type(tl.int32)) + pid * WORLD + peer
            while tl.atomic_cas(flag, 1, 0, sem="acquire", scope="sys") != 1:
                pass
    tl.debug_barrier()
    mine = tl.load(data_ptrs + RANK).to(tl.pointer_type(elem))
    for u in range(pid, num_units, programs):
        offs = u.to(tl.int64) * unit + lanes
        mask = (lanes < unit) & (offs < numel)
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for rank in tl.static_range(WORLD):
            if rank == RANK:
                total += tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            else:
                copy = tl.multiple_of(mine + (parity + rank) * slot_elems, 16)
                total += tl.load(copy + offs, mask=mask, other=0.0).to(tl.float32)
        reduced = total.to(elem)
        if NORM:
            summed = (reduced.to(tl.float32) + tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)).to(elem)
            tl.store(res_out_ptr + offs, summed, mask=mask)
            s = summed.to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / unit + eps)
            w = tl.load(w_ptr + lanes, mask=lanes < unit, other=0.0).to(tl.float32)
            tl.store(out_ptr + offs, (s * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(out_ptr + offs, reduced, mask=mask)


def _launch(x, res, w, out, res_out, eps, unit, num_units, block, norm, state) -> None:
    data_ptrs, flag_ptrs, counters, slot_elems, rank, world = state
    grid = (max(1, min(MAX_PROGRAMS, num_units)),)
    _one_shot_kernel[grid](x, res, w, out, res_out, data_ptrs, flag_ptrs, counters, x.numel(), unit, num_units,
                           slot_elems, eps, RANK=rank, WORLD=world, BLOCK=block, NORM=norm, num_warps=4)


def one_shot_all_reduce_(x: torch.Tensor, state: tuple) -> torch.Tensor:
    """Sum x over the ranks in place. x: contiguous, at most slot_elems elements; state (pointer
    and counter tensors, slot_elems, rank, world) comes from engine.tp.symmetric, which checks
    the rest."""
    units = triton.cdiv(x.numel(), BLOCK)
    _launch(x, x, x, x, x, 0.0, BLOCK, units, BLOCK, False, state)
    return x


def one_shot_all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                                     state: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(sum_ranks(x) + residual), sum_ranks(x) + residual) for x, residual [rows, dim]
    contiguous, with add_rms_norm's rounding; x is left as it was."""
    rows, dim = x.shape
    out, res_out = torch.empty_like(x), torch.empty_like(residual)
    _launch(x, residual, weight, out, res_out, eps, dim, rows, triton.next_power_of_2(dim), True, state)
    return out, res_out
