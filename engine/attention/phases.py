"""`auto` on CUDA with both flash-attn and Triton: each step's attention goes to the
implementation measured fastest for its phase (experiments/flash_attn/README.md, H100).

- Prefill and mixed steps replayed as CUDA graphs: the Triton kernel, the only one that reads a
  fixed-size tile map (engine.prefill_graphs).
- Eager prefill and mixed steps (more tokens than the largest prefill graph): flash-attn.
- Decode: Triton's split-KV kernel with balanced chunks. FA4 on SM90 cannot split a sequence's
  keys across programs, so a small batch with long contexts leaves most of the GPU idle.
"""

from __future__ import annotations

import torch


class PhaseRoutedBackend:
    name = "flash_attn+triton"

    def __init__(self, flash, triton) -> None:
        self.flash = flash
        self.triton = triton

    def captures_decode(self) -> bool:
        return True

    def captures_prefill(self) -> bool:
        return True

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta,  # engine.attention.metadata.AttentionMetadata
        scale: float,
    ) -> torch.Tensor:
        if meta.is_decode_only or meta.tile_seq is not None:
            return self.triton.forward(q, k, v, k_cache, v_cache, meta, scale)
        return self.flash.forward(q, k, v, k_cache, v_cache, meta, scale)
