"""The attention layer of a decoder block: reshapes to heads and hands off to the backend,
which owns both the paged-cache write and the attention itself."""

from __future__ import annotations

import torch
from torch import nn

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, backend: AttentionBackend):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.backend = backend

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """q [T, heads, head_dim]; k, v [T, kv_heads, head_dim] -> [T, heads * head_dim]."""
        k_cache, v_cache = kv_cache  # each [num_blocks, block_size, kv_heads, head_dim]
        out = self.backend.forward(q, k, v, k_cache, v_cache, meta, self.scale)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)
