"""Attention backend on the flash-attn package (FlashAttention-2 paged-KV entry points).

Prefill: flash_attn_varlen_func with block_table reads keys straight from the paged cache (its
causal mask is aligned bottom-right, i.e. query j of a sequence sits at seq_len - q_len + j, which
is this project's convention). Decode: flash_attn_with_kvcache, one query per sequence. New K/V
are written first by the project's store kernel so padded slots (< 0) are skipped the same way
as in the Triton backend.
"""

from __future__ import annotations

import torch

from engine.attention.registry import FLASH_ATTN_PAGE_MULTIPLE
from kernels.store_kvcache import store_kvcache


class FlashAttnBackend:
    name = "flash_attn"

    def __init__(self) -> None:
        try:
            from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
        except ImportError as exc:
            raise ImportError(
                "attention backend 'flash_attn' needs the flash-attn package "
                "(pip install flash-attn); use 'triton' or 'torch' instead"
            ) from exc
        self._varlen = flash_attn_varlen_func
        self._with_kvcache = flash_attn_with_kvcache

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
        block_size = k_cache.shape[1]
        if block_size % FLASH_ATTN_PAGE_MULTIPLE != 0:
            raise ValueError(
                f"block_size must be a multiple of {FLASH_ATTN_PAGE_MULTIPLE} for the flash_attn "
                f"backend (flash-attn's paged KV limit), got {block_size}"
            )
        store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.is_decode_only:
            out = self._with_kvcache(
                q.unsqueeze(1),  # [num_seqs, 1, num_heads, head_dim]
                k_cache,
                v_cache,
                cache_seqlens=meta.seq_lens,
                block_table=meta.block_tables,
                softmax_scale=scale,
                causal=True,
            )
            return out.squeeze(1)
        # cu_seqlens_k from the per-sequence context lengths, on device (prefill runs eagerly)
        cu_seqlens_k = torch.zeros(
            meta.seq_lens.shape[0] + 1, dtype=torch.int32, device=meta.seq_lens.device
        )
        cu_seqlens_k[1:] = torch.cumsum(meta.seq_lens, dim=0)
        return self._varlen(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q=meta.query_start_loc,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=meta.max_query_len,
            max_seqlen_k=meta.max_seq_len,
            softmax_scale=scale,
            causal=True,
            block_table=meta.block_tables,
        )
