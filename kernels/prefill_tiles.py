"""Host side of the prefill attention kernel's work split (no Triton import: the runner builds
tile maps on machines without it).

The kernel's programs each take one query tile (BLOCK_Q tokens of one sequence) for one KV head.
Launched directly, its grid is (sequences, KV heads, query tiles of the longest query), sized from
the batch. A CUDA graph needs a grid fixed at capture: then the kernel reads a tile map instead,
a list of (sequence, first token) pairs built here for each step and padded to a fixed length
with sequence -1 (those programs exit at once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Queries at least this long take the larger tile (the faster shape on H100, experiments/kernels)
LONG_QUERY = 4096
# NOTE: the larger tile's Q, K and V blocks (two pipeline stages) need 320 KiB of shared memory in
# float32, over Hopper's 227 KiB per block; at 2 bytes an element they need half. Wider elements
# keep the smaller tile at every query length.
LONG_TILE_MAX_ELEMENT_BYTES = 2


@dataclass(frozen=True)
class TileShape:
    block_m: int  # rows of a tile: BLOCK_Q tokens x the GQA group's query heads
    block_n: int  # keys per inner step
    num_warps: int
    block_q: int  # tokens of a tile


def tile_shape(group: int, max_query_len: int, element_bytes: int = 2) -> TileShape:
    """The tile the kernel uses for a batch whose longest query is max_query_len, with `group`
    query heads per KV head and q/K/V elements of element_bytes bytes."""
    long = max_query_len >= LONG_QUERY and element_bytes <= LONG_TILE_MAX_ELEMENT_BYTES
    block_m = 128 if long else 64
    block_m = max(block_m, 1 << max(0, group - 1).bit_length())  # a whole group per token
    return TileShape(block_m, 128 if long else 64, 8 if long else 4, block_m // group)


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
