"""Attention backend on the project's own Triton kernels (kernels/)."""

from __future__ import annotations

import torch

from kernels.decode_attention import DecodeArrivals, paged_decode_attention
from kernels.prefill_attention import paged_prefill_attention
from kernels.store_kvcache import store_kvcache


class TritonAttentionBackend:
    """Store-then-attend over the paged KV cache.

    Decode-only batches go to the split-KV decode kernel, which issues no host syncs and sizes
    nothing from tensor contents, so it can be captured in a CUDA graph. Its split count is chosen
    from meta.max_seq_len (a host int): when capturing, pass the longest context the graph will
    replay (e.g. max_model_len) so long contexts still get enough parallelism; any context length
    is computed correctly whatever the split count.

    Other batches go to the prefill kernel; with a tile map in the metadata (prefill CUDA graphs,
    engine.prefill_graphs) its grid is fixed too, and those steps can be captured as well.
    """

    name = "triton"

    def __init__(self) -> None:
        self._arrivals = DecodeArrivals()

    def supports_decode_graphs(self) -> bool:
        return True

    def supports_prefill_graphs(self) -> bool:
        return True

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta,  # engine.attention.metadata.AttentionMetadata
        scale: float,
    ) -> torch.Tensor:
        if k is not None:  # None: the caller's fused kernel has stored them
            store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.is_decode_only:
            return paged_decode_attention(
                q,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                scale,
                max_seq_len_hint=meta.max_seq_len,
                split_chunk=meta.decode_chunk,
                arrivals=self._arrivals.get(q.shape[0] * k_cache.shape[2], q.device),
            )
        return paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_tables,
            meta.max_query_len,
            scale,
            tiles=None if meta.tile_seq is None else (meta.tile_seq, meta.tile_start),
        )
