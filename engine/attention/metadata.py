"""What an attention backend needs to know about one step's batch, as tensors.

The batch is ragged: sequence i contributes query_lens[i] new tokens (a prefill chunk, a whole
prompt, or one decode token) and, after the step, has seq_lens[i] tokens of K/V in the paged
cache. Its new tokens are the last query_lens[i] positions of the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64, cache slot per new token; < 0 = padding, skip
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, cumulative query lengths (cu_seqlens_q)
    seq_lens: torch.Tensor  # [num_seqs] int32, context length per sequence AFTER this step
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, padded with 0
    max_query_len: int
    max_seq_len: int
    is_decode_only: bool  # every sequence has query length 1
    # A prefill CUDA graph's fixed-size work split for the Triton prefill kernel
    # (kernels.prefill_tiles): [n] int32 each, None outside prefill graphs.
    tile_seq: torch.Tensor | None = None
    tile_start: torch.Tensor | None = None
    # A decode step's fair share of keys per program of the Triton decode kernel
    # (kernels.decode_split.balanced_chunk): [1] int32; None cuts sequences evenly.
    decode_chunk: torch.Tensor | None = None


def slot_mapping_for(block_table: list[int], start: int, end: int, block_size: int) -> np.ndarray:
    """Cache slots of positions start..end-1 of one sequence, as int64 (no per-token Python loop)."""
    positions = np.arange(start, end, dtype=np.int64)
    blocks = np.asarray(block_table, dtype=np.int64)[positions // block_size]
    return blocks * block_size + positions % block_size


def make_metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    slot_mapping: list[int] | np.ndarray,
    device: torch.device | str = "cpu",
    block_table_width: int | None = None,
) -> AttentionMetadata:
    """Pack per-sequence lists into AttentionMetadata on `device`.

    block_table_width pads every block table to a fixed width (CUDA graphs want fixed shapes);
    by default the widest table sets it. slot_mapping may hold padding slots (< 0) beyond the
    real tokens, for padded batches.
    """
    num_seqs = len(query_lens)
    if num_seqs == 0:
        raise ValueError("query_lens must not be empty")
    if len(seq_lens) != num_seqs or len(block_tables) != num_seqs:
        raise ValueError(
            f"query_lens, seq_lens and block_tables must have one entry per sequence; got "
            f"{num_seqs}, {len(seq_lens)}, {len(block_tables)}"
        )
    q = np.asarray(query_lens, dtype=np.int64)
    s = np.asarray(seq_lens, dtype=np.int64)
    if (q < 1).any() or (s < q).any():
        raise ValueError("each query_len must be >= 1 and <= its seq_len")
    slots = np.asarray(slot_mapping, dtype=np.int64)
    if len(slots) < q.sum():
        raise ValueError(f"slot_mapping has {len(slots)} entries, expected >= sum(query_lens)={int(q.sum())}")
    width = max(len(t) for t in block_tables) if block_table_width is None else block_table_width
    if width < max(len(t) for t in block_tables):
        raise ValueError(f"block_table_width={width} is smaller than the longest block table")
    tables = np.zeros((num_seqs, max(width, 1)), dtype=np.int32)
    for i, table in enumerate(block_tables):  # per sequence, not per token
        tables[i, : len(table)] = table
    cu = np.zeros(num_seqs + 1, dtype=np.int32)
    np.cumsum(q, out=cu[1:])

    def put(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        if torch.device(device).type == "cuda":
            return t.pin_memory().to(device, non_blocking=True)
        return t.to(device)

    return AttentionMetadata(
        slot_mapping=put(slots),
        query_start_loc=put(cu),
        seq_lens=put(s.astype(np.int32)),
        block_tables=put(tables),
        max_query_len=int(q.max()),
        max_seq_len=int(s.max()),
        is_decode_only=bool((q == 1).all()),
    )
