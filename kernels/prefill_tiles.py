"""Host side of the prefill attention kernel's work split (no Triton import: the runner builds
tile maps on machines without it).

The kernel's programs each take one query tile (BLOCK_Q tokens of one sequence) for one KV head.
Launched directly, its grid is (sequences, KV heads, query tiles of the longest query), sized from
the batch. A CUDA graph needs a grid fixed at capture: then the kernel reads a tile map instead,
a list of (sequence, first token) pairs built here for each step and padded to a fixed length
with sequence -1 (those programs exit at once).
"""

from __future__ import annotations

import numpy as np

from engine.core.prefill_tiles import LONG_QUERY, LONG_TILE_MAX_ELEMENT_BYTES, TileShape, tile_shape

# the tile rule lives in engine.core.prefill_tiles (the simulator prices the same programs)
__all__ = ["LONG_QUERY", "LONG_TILE_MAX_ELEMENT_BYTES", "TileShape", "max_tiles", "query_tiles", "tile_shape"]


def max_tiles(num_tokens: int, num_seqs: int, block_q: int) -> int:
    """Tiles a batch of at most num_tokens query tokens over at most num_seqs sequences can need:
    each sequence's last tile may be partial."""
    return -(-num_tokens // block_q) + num_seqs


def query_tiles(query_lens: np.ndarray, seq_lens: np.ndarray, block_q: int,
                length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(sequence, first token) of every query tile as int32 arrays, padded with (-1, 0) to
    `length` when given. Tiles that see the most keys come first: the grid's tail is short."""
    query_lens = np.asarray(query_lens, np.int64)
    counts = -(-query_lens // block_q)
    seq = np.repeat(np.arange(len(query_lens)), counts)
    first = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    start = first * block_q
    keys_seen = (np.asarray(seq_lens, np.int64) - query_lens)[seq] + start
    order = np.argsort(-keys_seen, kind="stable")
    seq, start = seq[order], start[order]
    n = len(seq)
    if length is not None:
        if n > length:
            raise ValueError(f"the batch has {n} query tiles, more than the {length} the tile map holds")
        seq = np.concatenate([seq, np.full(length - n, -1)])
        start = np.concatenate([start, np.zeros(length - n, np.int64)])
    return seq.astype(np.int32), start.astype(np.int32)
