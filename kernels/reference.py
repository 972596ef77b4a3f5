"""Pure-torch references for the paged-KV kernels: slow, per-sequence, obviously correct.

Layout shared with the kernels:
    k_cache, v_cache   [num_blocks, block_size, num_kv_heads, head_dim]
    slot of position p of a sequence = block_table[p // block_size] * block_size + p % block_size
Query head h reads KV head h // (num_heads // num_kv_heads) (grouped-query attention).
"""

from __future__ import annotations

import torch


def store_kvcache_ref(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, < 0 = padding
) -> None:
    """Write k/v rows into the caches in place, skipping negative slots."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_flat = k_cache.view(-1, *k_cache.shape[2:])  # [num_slots, num_kv_heads, head_dim]
    v_flat = v_cache.view(-1, *v_cache.shape[2:])
    k_flat[slots] = k[keep].to(k_cache.dtype)
    v_flat[slots] = v[keep].to(v_cache.dtype)


def gather_kv(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: torch.Tensor,  # [max_blocks_per_seq] int
    seq_len: int,
) -> torch.Tensor:
    """The first seq_len cache rows of one sequence, in position order."""
    block_size = cache.shape[1]
    pos = torch.arange(seq_len, device=cache.device)
    blocks = block_table.to(cache.device).long()[pos // block_size]
    return cache[blocks, pos % block_size]  # [seq_len, num_kv_heads, head_dim]


def paged_attention_ref(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int
    seq_lens: torch.Tensor,  # [num_seqs] int, context length including this step's queries
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int
    scale: float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Causal attention of every query token over its sequence's cached keys, computed in `dtype`.

    The queries of a sequence are its last q_len positions: query j sits at position
    seq_len - q_len + j and sees keys 0..that position. Returns [num_tokens, num_heads, head_dim]
    in `dtype`.
    """
    num_heads = q.shape[1]
    group = num_heads // k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    starts = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        q_lo, q_hi = starts[i], starts[i + 1]
        q_len = q_hi - q_lo
        if q_len == 0:
            continue
        k = gather_kv(k_cache, block_tables[i], seq_len).to(dtype)  # [seq_len, kv_heads, head_dim]
        v = gather_kv(v_cache, block_tables[i], seq_len).to(dtype)
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [num_heads, seq_len, head_dim]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        qs = q[q_lo:q_hi].to(dtype).transpose(0, 1)  # [num_heads, q_len, head_dim]
        scores = torch.matmul(qs, k.transpose(1, 2)) * scale  # [num_heads, q_len, seq_len]
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        visible = k_pos[None, :] <= q_pos[:, None]  # [q_len, seq_len]
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q_lo:q_hi] = torch.matmul(probs, v).transpose(0, 1)
    return out


def decode_attention_ref(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim], one query per sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    seq_lens: torch.Tensor,  # [num_seqs]
    scale: float,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Decode as the q_len == 1 case of paged_attention_ref; sequences of length 0 give zeros."""
    num_seqs = q.shape[0]
    has_query = (seq_lens > 0).to(torch.int64)
    query_start_loc = torch.zeros(num_seqs + 1, dtype=torch.int64, device=q.device)
    query_start_loc[1:] = torch.cumsum(has_query, 0)
    rows = torch.nonzero(has_query, as_tuple=True)[0]
    packed = paged_attention_ref(
        q[rows], k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, dtype
    )
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    out[rows] = packed
    return out
