"""The interface every attention implementation provides (torch reference, Triton, flash-attn)."""

from __future__ import annotations

from typing import Protocol

import torch

from engine.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    name: str

    def supports_decode_graphs(self) -> bool:
        """Decode steps can be captured in a CUDA graph (no host syncs, grid fixed by the batch)."""
        ...

    def supports_prefill_graphs(self) -> bool:
        """Prefill and mixed steps can be captured too (engine.prefill_graphs' padded tile maps)."""
        ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """Store the new K/V into the paged cache, then attend causally over the cache.

        q [num_tokens, num_heads, head_dim]; k, v [num_tokens, num_kv_heads, head_dim] (new tokens);
        k_cache, v_cache [num_blocks, block_size, num_kv_heads, head_dim].
        v may be a non-contiguous view (a slice of the fused qkv output, unit stride on the last
        dim); q and k are contiguous. Cache slots a sequence does not own may hold any bits.
        1) write k, v at meta.slot_mapping (slots < 0 are padding and are not written); k and v
           are both None when the caller has already written them there (kernels.rotary's
           fused store);
        2) query j of sequence i sits at position seq_len - query_len + j and attends to cache
           positions 0..its own position of that sequence; GQA when num_heads > num_kv_heads.
        Returns [num_tokens, num_heads, head_dim]; rows of padding tokens are unspecified.
        """
        ...
