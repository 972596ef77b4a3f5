"""Attention backend on flash-attn: FlashAttention-4 (`flash_attn.cute`, CuTe DSL, Hopper and
newer) where it imports, else FlashAttention-2's paged-KV entry points.

Both read keys straight from the paged cache through the block table, with the causal mask
aligned bottom-right (query j of a sequence sits at seq_len - q_len + j: this project's
convention). New K/V are written first by the project's store kernel, so padded slots (< 0) are
skipped as in the Triton backend.

FA4 on SM90 takes the block table as `page_table` with per-sequence key counts in `seqused_k`
(not with cu_seqlens_k), any page size, float16/bfloat16 only, and no split-KV (num_splits=1):
a decode step gets one program per (sequence, KV head group), which is why `auto` can route
small decode batches with long contexts to the Triton split-KV kernel instead
(engine.attention.registry). Pages past a sequence's keys are read and masked, so they must hold
finite values: the model allocates its cache zeroed.
FA2 reads the cache only in pages of a multiple of 256 tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# flash-attn 2 reads a paged cache only in pages of a multiple of 256 tokens.
FA2_PAGE_MULTIPLE = 256
FA4_DTYPES = (torch.float16, torch.bfloat16)


def import_fa4() -> Callable | None:
    """FA4's varlen entry point, or None where flash_attn.cute does not import."""
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except ImportError:  # also a missing CuTe DSL or CUDA runtime under it
        return None
    return flash_attn_varlen_func


def import_fa2() -> tuple[Callable, Callable] | None:
    try:
        from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
    except ImportError:
        return None
    return flash_attn_varlen_func, flash_attn_with_kvcache


def flash_attn_problem(block_size: int | None, dtype: torch.dtype | None) -> str | None:
    """Why the flash_attn backend cannot serve this cache, or None if it can (or nothing is known)."""
    if import_fa4() is not None:
        if dtype is not None and dtype not in FA4_DTYPES:
            return f"FlashAttention-4 computes in float16 or bfloat16 only, got {dtype}"
        return None
    if import_fa2() is None:
        return "the flash-attn package is not installed (pip install '.[flash]' for FlashAttention-4)"
    if block_size is not None and block_size % FA2_PAGE_MULTIPLE:
        return (f"flash-attn 2 needs block_size to be a multiple of {FA2_PAGE_MULTIPLE} "
                f"(its paged KV limit), got {block_size}")
    return None


class FlashAttnBackend:
    name = "flash_attn"

    def __init__(self) -> None:
        self._fa4 = import_fa4()
        self._fa2 = None if self._fa4 is not None else import_fa2()
        if self._fa4 is None and self._fa2 is None:
            raise ImportError("attention backend 'flash_attn' needs flash-attn: pip install '.[flash]' "
                              "(FlashAttention-4) or flash-attn 2; use 'triton' or 'torch' instead")
        self.version = 4 if self._fa4 is not None else 2
        from kernels.store_kvcache import store_kvcache  # Triton: imported only where it runs

        self._store = store_kvcache

    def supports_decode_graphs(self) -> bool:
        return True

    def supports_prefill_graphs(self) -> bool:
        # prefill graphs replay a fixed grid over a tile map, which only the Triton kernel reads
        return False

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
        if self._fa4 is not None and q.dtype not in FA4_DTYPES:
            raise ValueError(f"attention backend 'flash_attn': FlashAttention-4 computes in float16 or "
                             f"bfloat16 only, got {q.dtype}")
        if self._fa4 is None and k_cache.shape[1] % FA2_PAGE_MULTIPLE:
            raise ValueError(f"attention backend 'flash_attn': flash-attn 2 needs block_size to be a "
                             f"multiple of {FA2_PAGE_MULTIPLE}, got {k_cache.shape[1]}")
        if k is not None:  # None: the caller's fused kernel has stored them
            self._store(k, v, k_cache, v_cache, meta.slot_mapping)
        if self._fa4 is not None:
            return self._forward_fa4(q, k_cache, v_cache, meta, scale)
        return self._forward_fa2(q, k_cache, v_cache, meta, scale)

    def _forward_fa4(self, q, k_cache, v_cache, meta, scale) -> torch.Tensor:
        out, _ = self._fa4(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q=meta.query_start_loc,
            seqused_k=meta.seq_lens,
            max_seqlen_q=meta.max_query_len,
            page_table=meta.block_tables,
            softmax_scale=scale,
            causal=True,
            num_splits=1,  # SM90: "SplitKV not supported"
        )
        return out  # [num_tokens, num_heads, head_dim]

    def _forward_fa2(self, q, k_cache, v_cache, meta, scale) -> torch.Tensor:
        varlen, with_kvcache = self._fa2
        if meta.is_decode_only:
            out = with_kvcache(
                q.unsqueeze(1),  # [num_seqs, 1, num_heads, head_dim]
                k_cache, v_cache, cache_seqlens=meta.seq_lens, block_table=meta.block_tables,
                softmax_scale=scale, causal=True,
            )
            return out.squeeze(1)
        cu_seqlens_k = torch.zeros(meta.seq_lens.shape[0] + 1, dtype=torch.int32, device=meta.seq_lens.device)
        cu_seqlens_k[1:] = torch.cumsum(meta.seq_lens, dim=0)
        return varlen(
            q, k_cache, v_cache, cu_seqlens_q=meta.query_start_loc, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=meta.max_query_len, max_seqlen_k=meta.max_seq_len, softmax_scale=scale,
            causal=True, block_table=meta.block_tables,
        )
