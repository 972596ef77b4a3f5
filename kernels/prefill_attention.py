"""Causal varlen prefill attention whose keys come from the paged cache.

Covers fresh prompts, prefix-cache hits and chunked prefill alike: a sequence's q_len queries are
its last positions (query j sits at seq_len - q_len + j), and every key, old or new, is read from
k_cache/v_cache (the new ones were stored there first by store_kvcache).

One program per (sequence, KV head, query tile). The tile's M rows are BLOCK_Q tokens times the
GQA group's query heads, so K/V tiles are loaded once per group. Keys that every row may see are
processed without a mask; only the last few key tiles (the causal diagonal) pay for it.

With a tile map (kernels.prefill_tiles) the grid is (KV heads, map entries) instead, fixed in
size, so that a CUDA graph can capture it: each program reads its (sequence, first token).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.prefill_tiles import LONG_QUERY, tile_shape
from kernels.validation import (
    LOG2E,
    check_block_tables,
    check_cache_pair,
    check_int_tensor,
    check_query,
)

__all__ = ["LONG_QUERY", "paged_prefill_attention"]


@triton.jit
def _attend_tiles(
    q, m, l, acc, lo, hi, q_pos,
    k_cache_ptr, v_cache_ptr, bt_row, kv_head_off, stride_cb, stride_cs, d, d_ok,
    qk_scale, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, MASKED: tl.constexpr,
):  # fmt: skip
    for tile in range(lo, hi, BLOCK_N):
        pos = tile + tl.arange(0, BLOCK_N)
        if MASKED:
            pos_ok = pos < hi
            blk = tl.load(bt_row + pos // PAGE, mask=pos_ok, other=0).to(tl.int64)
            kv_mask = pos_ok[:, None] & d_ok[None, :]
        else:
            blk = tl.load(bt_row + pos // PAGE).to(tl.int64)
            kv_mask = d_ok[None, :]
        row = blk * stride_cb + (pos % PAGE) * stride_cs + kv_head_off  # [BLOCK_N]
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
        if MASKED:
            visible = (pos[None, :] <= q_pos[:, None]) & (pos < hi)[None, :]
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
        m = m_new
    return m, l, acc


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
    tile_seq_ptr, tile_start_ptr, qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt, stride_cb, stride_cs, stride_ch,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, TILE_MAP: tl.constexpr,
):  # fmt: skip
    if TILE_MAP:
        # heads vary fastest: every head's program of a map entry starts before the next entry's,
        # and the map lists the tiles that see the most keys first, so the longest programs start
        # first across all heads. Launched head after head, the last heads' longest tiles would
        # start late and trail the grid: one fresh 4,096-token prompt's attention 1.20x as long on
        # an H200 (Qwen3-0.6B's heads), the whole graph step 1.12x (experiments/kernels/tile_order)
        kvh = tl.program_id(0)
        seq = tl.load(tile_seq_ptr + tl.program_id(1))
        if seq < 0:  # padding of the map
            return
        t0 = tl.load(tile_start_ptr + tl.program_id(1))
    else:
        seq = tl.program_id(0)
        kvh = tl.program_id(1)
        # NOTE: later query tiles see more keys; launching them first shortens the tail of the grid
        t0 = (tl.num_programs(2) - 1 - tl.program_id(2)) * BLOCK_Q
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if t0 >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx = seq_len - q_len  # position of query 0 of this sequence

    r = tl.arange(0, BLOCK_M)
    tok = t0 + r // GROUP
    heads = kvh * GROUP + r % GROUP
    row_ok = (r < BLOCK_Q * GROUP) & (tok < q_len)
    q_pos = ctx + tok
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(  # [BLOCK_M, BLOCK_D]
        q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :], other=0.0,
    )  # fmt: skip
    if k_cache_ptr.dtype.element_ty.is_fp8():
        # dot products over an fp8 cache run in fp16: e4m3 -> fp16 is exact, and it measured
        # faster than e4m3 -> bf16 (experiments/fp8_kv/README.md)
        q = q.to(tl.float16)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_head_off = kvh * stride_ch
    # keys [0, ctx + t0] are visible to every row of the tile; round down to whole key tiles
    full_end = ((ctx + t0 + 1) // BLOCK_N) * BLOCK_N
    last_tok = tl.minimum(t0 + BLOCK_Q, q_len) - 1
    m, l, acc = _attend_tiles(
        q, m, l, acc, 0, full_end, q_pos, k_cache_ptr, v_cache_ptr, bt_row, kv_head_off,
        stride_cb, stride_cs, d, d_ok, qk_scale, BLOCK_N, PAGE, False,
    )  # fmt: skip
    m, l, acc = _attend_tiles(
        q, m, l, acc, full_end, ctx + last_tok + 1, q_pos, k_cache_ptr, v_cache_ptr, bt_row,
        kv_head_off, stride_cb, stride_cs, d, d_ok, qk_scale, BLOCK_N, PAGE, True,
    )  # fmt: skip

    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    dst = out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def paged_prefill_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32 (cu_seqlens_q)
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length after this step
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    max_query_len: int,
    scale: float,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
    tiles: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Causal attention of a varlen batch over the paged cache; returns [num_tokens, heads, dim].

    Tile shape by default: 64x64 with 4 warps, 128x128 with 8 warps once max_query_len reaches
    LONG_QUERY (the faster of the shapes swept on H100 at each length, see experiments/kernels).
    tiles: a tile map (tile_seq, tile_start) [n] int32 of kernels.prefill_tiles.query_tiles, built
    with the tile that max_query_len selects (tile_shape); the grid is then fixed by n, not by the
    batch's contents (CUDA graphs). max_query_len need only bound the real queries then.
    """
    check_cache_pair(k_cache, v_cache)
    group = check_query(q, k_cache)
    num_seqs = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    check_int_tensor("seq_lens", seq_lens, (num_seqs,))
    check_int_tensor("query_start_loc", query_start_loc, (num_seqs + 1,))
    check_block_tables(block_tables, num_seqs)
    if max_query_len < 0:
        raise ValueError(f"max_query_len must be >= 0, got {max_query_len}")
    # zeros, not empty: padded token rows beyond query_start_loc[-1] are never visited
    out = torch.zeros_like(q)
    if num_seqs == 0 or max_query_len == 0 or q.shape[0] == 0:
        return out
    _, page, num_kv_heads, head_dim = k_cache.shape
    default = tile_shape(group, max_query_len, q.element_size())
    if tiles is not None:
        if block_m or block_n or num_warps:
            raise ValueError("a tile map is built for the default tile shape: "
                             "do not pass block_m, block_n or num_warps")
        tile_seq, tile_start = tiles
        check_int_tensor("tile_seq", tile_seq, (tile_seq.numel(),))
        check_int_tensor("tile_start", tile_start, (tile_seq.numel(),))
        if tile_seq.numel() == 0:
            return out
        grid = (num_kv_heads, tile_seq.shape[0])  # heads fastest (the kernel says why)
    block_m = max(block_m or default.block_m, triton.next_power_of_2(group))
    block_n = block_n or default.block_n
    num_warps = num_warps or default.num_warps
    block_q = block_m // group
    if tiles is None:
        tile_seq = tile_start = seq_lens  # not read
        grid = (num_seqs, num_kv_heads, triton.cdiv(max_query_len, block_q))
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, query_start_loc, seq_lens, block_tables, tile_seq, tile_start,
        scale * LOG2E, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n, PAGE=page, TILE_MAP=tiles is not None,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
