"""The prefill attention kernel's tile rule (kernels.prefill_attention), in plain ints so that the
simulator (sim.prefill_programs) prices the programs the engine launches without importing Triton.

The kernel's programs each take one query tile (block_q tokens of one sequence) for one KV head.
"""

from __future__ import annotations

from dataclasses import dataclass

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
