"""Reference attention over the paged KV cache in plain PyTorch (CPU and GPU).

Clarity over speed, but batched: the ragged queries are scattered into a padded
[num_seqs, max_query_len] layout, each sequence's K/V is gathered from its block table, and one
scaled_dot_product_attention call with an explicit causal mask does the rest. There is no
per-sequence Python loop, so it stays usable for whole benchmarks. It is eager-only: the store's
boolean mask syncs with the host and the key count follows meta.max_seq_len, so a CUDA graph
captured over it would replay stale shapes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v [num_tokens, num_kv_heads, head_dim] into the caches at slot_mapping (< 0 skipped)."""
    num_kv_heads, head_dim = k_cache.shape[-2:]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    for new, cache in ((k, k_cache), (v, v_cache)):
        # view (not reshape): a silent copy here would drop the writes.
        rows, values = cache.view(-1, num_kv_heads, head_dim), to_cache_dtype(new[valid], cache.dtype)
        if cache.dtype == torch.float8_e4m3fn:  # index_copy_ has no float8 kernel; the bits are the same
            rows, values = rows.view(torch.uint8), values.view(torch.uint8)
        rows.index_copy_(0, slots, values)


def to_cache_dtype(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """x as the cache stores it: an fp8 cache saturates at its largest finite value (float8 e4m3
    has no infinity, and a cast out of range may give NaN), as the Triton store kernel does."""
    if cache_dtype == torch.float8_e4m3fn:
        limit = torch.finfo(cache_dtype).max
        x = x.clamp(-limit, limit)
    return x.to(cache_dtype)


class TorchAttentionBackend:
    name = "torch"

    def supports_decode_graphs(self) -> bool:
        return False

    def supports_prefill_graphs(self) -> bool:
        return False

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        if k is not None:  # None: the caller's fused kernel has stored them
            store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        num_tokens, num_heads, head_dim = q.shape
        block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
        device = q.device
        num_seqs = meta.seq_lens.shape[0]

        # NOTE: one extra "trash" sequence (index num_seqs, length 1, block 0) absorbs padding
        # tokens past query_start_loc[-1], so their rows never need a host-side count.
        cu = meta.query_start_loc.long()  # [num_seqs + 1]
        query_lens = torch.cat([cu[1:] - cu[:-1], cu.new_ones(1)])  # [num_seqs + 1]
        seq_lens = torch.cat([meta.seq_lens.long(), cu.new_ones(1)])  # [num_seqs + 1]
        tok = torch.arange(num_tokens, device=device)
        seq_of = torch.searchsorted(cu[1:].contiguous(), tok, right=True)  # [num_tokens] in [0, num_seqs]
        real = seq_of < num_seqs
        j = torch.where(real, tok - cu[seq_of.clamp(max=num_seqs - 1)], 0)  # index within its query

        max_q = meta.max_query_len
        q_pad = q.new_zeros(num_seqs + 1, max_q, num_heads, head_dim)
        q_pad[seq_of, j] = q

        # gather each sequence's K/V: [num_seqs + 1, num_keys, num_kv_heads, head_dim]
        num_table_blocks = -(-meta.max_seq_len // block_size)
        tables = meta.block_tables[:, :num_table_blocks].long()
        tables = torch.cat([tables, tables.new_zeros(1, tables.shape[1])])
        num_keys = num_table_blocks * block_size
        keys = k_cache[tables].reshape(num_seqs + 1, num_keys, num_kv_heads, head_dim)
        values = v_cache[tables].reshape(num_seqs + 1, num_keys, num_kv_heads, head_dim)
        key_pos = torch.arange(num_keys, device=device)
        # Slots past seq_len may hold stale data or NaN from an uninitialised cache; a masked score
        # of NaN would still poison softmax, so zero them rather than rely on the mask.
        in_seq = (key_pos[None, :] < seq_lens[:, None])[:, :, None, None]
        keys = torch.where(in_seq, keys.to(q.dtype), 0)
        values = torch.where(in_seq, values.to(q.dtype), 0)

        # query j of sequence b sits at position seq_len - query_len + j
        q_pos = seq_lens[:, None] - query_lens[:, None] + torch.arange(max_q, device=device)[None, :]
        mask = key_pos[None, None, :] <= q_pos[:, :, None]  # [num_seqs + 1, max_q, num_keys]

        out = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2),  # [num_seqs + 1, num_heads, max_q, head_dim]
            keys.transpose(1, 2),  # [num_seqs + 1, num_kv_heads, num_keys, head_dim]
            values.transpose(1, 2),
            attn_mask=mask[:, None],
            scale=scale,
            enable_gqa=num_heads != num_kv_heads,
        )  # [num_seqs + 1, num_heads, max_q, head_dim]
        return out.transpose(1, 2)[seq_of, j]  # [num_tokens, num_heads, head_dim]
