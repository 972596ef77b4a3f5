"""`auto` on CUDA with both flash-attn and Triton: each step's attention goes to the
implementation measured fastest for its phase (experiments/flash_attn/README.md, one H100,
`python experiments/flash_attn/bench_phases.py`).

- Decode: Triton's split-KV kernel with balanced chunks. FA4 on SM90 cannot split a sequence's
  keys across programs: 1.5-6x slower for batches under 32, 1-8% slower or level above.
- Prefill and mixed steps replayed as CUDA graphs: Triton, the only kernel that reads a fixed-size
  tile map (engine.prefill_graphs).
- Eager prefill and mixed steps: FA4's kernels run 0.5-0.7x Triton's time on long contexts, but
  each call costs ~0.1-0.25 ms of host work; so FA4 only where the attention work is large.
"""

from __future__ import annotations

import torch

# Eager steps with at least this many (query head, query, key) triples go to flash-attn: the
# measured crossover lies between 0.75e8 (Triton 2.4x faster) and 3e8 (FA4 2x faster).
FLASH_PREFILL_MIN_WORK = 1.5e8


def prefill_work(num_tokens: int, num_heads: int, max_query_len: int, max_seq_len: int) -> float:
    """An upper estimate of a step's attention triples from host-side bounds only (no sync): every
    token is taken to sit in the longest sequence's last chunk."""
    return num_tokens * num_heads * max(max_seq_len - max_query_len / 2, 1.0)


class PhaseRoutedBackend:
    name = "flash_attn+triton"

    def __init__(self, flash, triton) -> None:
        self.flash = flash
        self.triton = triton

    def supports_decode_graphs(self) -> bool:
        return True

    def supports_prefill_graphs(self) -> bool:
        return True

    def pick(self, q: torch.Tensor, meta):
        if meta.is_decode_only or meta.tile_seq is not None:
            return self.triton
        work = prefill_work(q.shape[0], q.shape[1], meta.max_query_len, meta.max_seq_len)
        return self.flash if work >= FLASH_PREFILL_MIN_WORK else self.triton

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
        return self.pick(q, meta).forward(q, k, v, k_cache, v_cache, meta, scale)
