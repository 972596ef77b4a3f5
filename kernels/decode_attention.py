"""Paged decode attention, one query token per sequence, split-KV (flash-decoding).

Stage 1: one program per (sequence, KV head, split) walks its chunk of the context and keeps an
online softmax for all query heads of that KV head at once (the GQA group rides in the M dimension
of the dot products), so each K/V row is read from memory once per group. The splits' partial
results are merged by their log-sum-exp in the same launch: each program of a split sequence
stores its partial, then counts itself in on a per-(sequence, KV head) arrival counter, and the
program that arrives last merges them all and sets the counter back to zero. A separate merge
pass would cost a kernel per layer per decode step: a launch of mostly empty programs plus its
launch gap in the graph.

The split count only sets parallelism: each sequence's chunk length is derived in the kernel from
its real length (and, when the step passes one, the batch's fair share of keys per program:
kernels.decode_split says why), so one launch shape serves every batch of its size (what CUDA-graph
replay needs). A sequence that fits one program is written directly and skips the merge; the
programs a sequence does not need return at once.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.decode_split import choose_num_splits
from kernels.validation import (
    LOG2E,
    check_block_tables,
    check_cache_pair,
    check_int_tensor,
    check_query,
)

__all__ = ["choose_num_splits", "paged_decode_attention"]


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, mid_o_ptr, mid_lse_ptr, chunk_ptr, arrivals_ptr,
    qk_scale, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_cs, stride_ch,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr, HAS_CHUNK: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    chunk, used = _chunk_of(seq_len, chunk_ptr, num_splits, BLOCK_N, HAS_CHUNK)
    if split < used:
        _decode_split_body(
            q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, out_ptr, mid_o_ptr, mid_lse_ptr,
            arrivals_ptr, qk_scale, num_splits, stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
            stride_cb, stride_cs, stride_ch, seq, kvh, split, seq_len, chunk, used,
            NUM_HEADS, GROUP, BLOCK_G, HEAD_DIM, BLOCK_D, BLOCK_N, PAGE,
        )  # fmt: skip


@triton.jit
def _chunk_of(seq_len, chunk_ptr, num_splits, BLOCK_N: tl.constexpr, HAS_CHUNK: tl.constexpr):
    """(keys per program, programs used) of one sequence: kernels.decode_split.split_chunks."""
    chunk = tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N, BLOCK_N)
    if HAS_CHUNK:
        chunk = tl.maximum(chunk, tl.load(chunk_ptr))
    return chunk, tl.maximum(tl.cdiv(seq_len, chunk), 1)


@triton.jit
def _decode_split_body(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, out_ptr, mid_o_ptr, mid_lse_ptr, arrivals_ptr,
    qk_scale, num_splits, stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_cs, stride_ch, seq, kvh, split, seq_len, chunk, used,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
):  # fmt: skip
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(  # [BLOCK_G, BLOCK_D]
        q_ptr + seq * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=g_ok[:, None] & d_ok[None, :], other=0.0,
    )  # fmt: skip
    if k_cache_ptr.dtype.element_ty.is_fp8():
        # dot products over an fp8 cache run in fp16: e4m3 -> fp16 is exact, and it measured
        # faster than e4m3 -> bf16 (experiments/fp8_kv/README.md)
        q = q.to(tl.float16)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile in range(start, end, BLOCK_N):
        pos = tile + tl.arange(0, BLOCK_N)
        pos_ok = pos < end
        blk = tl.load(bt_row + pos // PAGE, mask=pos_ok, other=0).to(tl.int64)
        row = blk * stride_cb + (pos % PAGE) * stride_cs + kvh * stride_ch  # [BLOCK_N]
        kv_mask = pos_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        m, l, acc = _attend_tile(q, k, v, pos_ok, m, l, acc, qk_scale)
    _write_output(out_ptr, mid_o_ptr, mid_lse_ptr, arrivals_ptr, m, l, acc, num_splits, stride_ot, stride_oh,
                  seq, kvh, split, heads, g_ok, d, d_ok, used, NUM_HEADS, GROUP, HEAD_DIM, BLOCK_G, BLOCK_D)


@triton.jit
def _attend_tile(q, k, v, keys_ok, m, l, acc, qk_scale):
    """One tile of keys folded into a program's running softmax (log2 units): (m, l, acc) after it.
    q [BLOCK_G, d]; k, v [BLOCK_N, d] in q's dtype; keys_ok [BLOCK_N] masks keys past the chunk."""
    s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_G, BLOCK_N]
    s = tl.where(keys_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m - m_new)
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
    return m_new, l, acc


@triton.jit
def _write_output(
    out_ptr, mid_o_ptr, mid_lse_ptr, arrivals_ptr, m, l, acc, num_splits, stride_ot, stride_oh,
    seq, kvh, split, heads, g_ok, d, d_ok, used,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """A program's result: the output itself when its sequence has one program, else its partial,
    and the merge of all partials by the last of the sequence's programs to arrive."""
    # seq_len 0 (a padded row) leaves l == 0: it must produce zeros, never 0/0.
    has = l > 0
    o = acc / tl.where(has, l, 1.0)[:, None]
    if used == 1:
        dst = out_ptr + seq * stride_ot + heads[:, None] * stride_oh + d[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])
    else:
        lse = tl.where(has, m + tl.log2(tl.where(has, l, 1.0)), float("-inf"))
        mid = (seq * NUM_HEADS + heads) * num_splits + split  # [BLOCK_G]
        tl.store(mid_lse_ptr + mid, lse, mask=g_ok)
        tl.store(
            mid_o_ptr + mid[:, None] * HEAD_DIM + d[None, :], o,
            mask=g_ok[:, None] & d_ok[None, :],
        )  # fmt: skip
        # Every thread's stores are issued before one release-ordered arrival; the last program
        # to arrive acquires them all (the partials are read past L1, which is not coherent).
        tl.debug_barrier()
        counter = arrivals_ptr + seq * (NUM_HEADS // GROUP) + kvh
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == used - 1:
            _merge_group(mid_o_ptr, mid_lse_ptr, out_ptr, num_splits, stride_ot, stride_oh, seq, heads,
                         g_ok, used, NUM_HEADS, HEAD_DIM, BLOCK_G, BLOCK_D)
            tl.store(counter, 0)


@triton.jit
def _merge_group(
    mid_o_ptr, mid_lse_ptr, out_ptr, num_splits, stride_ot, stride_oh, seq, heads, g_ok, used,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The output of one sequence's query heads `heads`: its `used` partials merged by log-sum-exp."""
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    base = (seq * NUM_HEADS + heads) * num_splits  # [BLOCK_G]
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    den = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for s in range(0, used):
        lse = tl.load(mid_lse_ptr + base + s, mask=g_ok, other=float("-inf"), cache_modifier=".cg")
        part = tl.load(mid_o_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :],
                       mask=g_ok[:, None] & d_ok[None, :], other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m, lse)
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - ref)
        weight = tl.exp2(lse - ref)
        den = den * alpha + weight
        acc = acc * alpha[:, None] + weight[:, None] * part
        m = m_new
    res = acc / tl.where(den > 0, den, 1.0)[:, None]
    dst = out_ptr + seq * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(dst, res.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including the query token
    scale: float,
    *,
    max_seq_len_hint: int | None = None,
    num_splits: int | None = None,
    split_chunk: torch.Tensor | None = None,
    arrivals: torch.Tensor | None = None,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Attention of each sequence's single query over cache positions 0..seq_len-1.

    `max_seq_len_hint` (a host int, e.g. meta.max_seq_len or max_model_len for graph capture) only
    picks the split count; by default the block table's capacity bounds it. `split_chunk`: a
    1-element int32 device tensor, the batch's fair share of keys per program
    (kernels.decode_split.balanced_chunk); None cuts every sequence into even pieces. Returns
    [num_seqs, num_heads, head_dim] in q's dtype; sequences with seq_len 0 give zeros.

    `arrivals`: int32 device tensor of at least num_seqs * num_kv_heads zeros, the split programs'
    arrival counters, which the kernel leaves at zero again (so a caller can keep one, e.g. for
    CUDA-graph replays: DecodeArrivals); None allocates zeros for this call.
    """
    check_cache_pair(k_cache, v_cache)
    group = check_query(q, k_cache)
    num_seqs, num_heads, head_dim = q.shape
    check_int_tensor("seq_lens", seq_lens, (num_seqs,))
    check_block_tables(block_tables, num_seqs)
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    _, page, num_kv_heads, _ = k_cache.shape
    has_chunk = split_chunk is not None
    if has_chunk:
        check_int_tensor("split_chunk", split_chunk, (1,))
    if num_splits is None:
        hint = max_seq_len_hint if max_seq_len_hint is not None else block_tables.shape[1] * page
        num_splits = choose_num_splits(num_seqs, num_kv_heads, hint, _num_sms(q.device.index or 0), has_chunk)
    if not 1 <= num_splits <= 1024:
        raise ValueError(f"num_splits must be in [1, 1024], got {num_splits}")
    direct = num_splits == 1
    if direct:
        mid_o = mid_lse = arrivals = out  # unused by the kernel
    else:
        mid_o = torch.empty(
            (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
        mid_lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=q.device)
        if arrivals is None:
            arrivals = torch.zeros(num_seqs * num_kv_heads, dtype=torch.int32, device=q.device)
        elif arrivals.dtype != torch.int32 or arrivals.numel() < num_seqs * num_kv_heads:
            raise ValueError(f"arrivals must be int32 with >= {num_seqs * num_kv_heads} elements, got "
                             f"{arrivals.dtype} with {arrivals.numel()}")
    block_d = triton.next_power_of_2(head_dim)
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, mid_o, mid_lse,
        split_chunk if has_chunk else seq_lens, arrivals, scale * LOG2E, num_splits,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_HEADS=num_heads, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=block_n, PAGE=page, HAS_CHUNK=has_chunk,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out


class DecodeArrivals:
    """One zeroed arrival-counter buffer kept for an attention backend's decode calls.

    A CUDA graph records the buffer's address, so a buffer once handed out is never freed while
    this object lives (growing keeps the old ones). Zeroing is a kernel, which inside a capture
    would run only at replay: a capture that needs more than the buffer holds gets None (the call
    then zeroes a buffer of its own, inside the graph). Graph capture runs each size eagerly
    first (engine.graph_capture), so in practice the buffer is grown before any capture.
    """

    def __init__(self, minimum: int = 16384) -> None:
        self.minimum = minimum
        self._buffers: list[torch.Tensor] = []

    def get(self, needed: int, device: torch.device) -> torch.Tensor | None:
        current = self._buffers[-1] if self._buffers else None
        if current is not None and current.numel() >= needed and current.device == device:
            return current
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return None
        self._buffers.append(torch.zeros(max(needed, self.minimum), dtype=torch.int32, device=device))
        return self._buffers[-1]
