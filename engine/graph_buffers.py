"""The static device buffers CUDA graphs read their inputs from, and their layout, declared once.

A step's index arrays reach the device in one copy per dtype (engine.host_staging): the int64
buffer holds the token rows and the logits rows, the int32 buffer the sequence rows and the
attention kernels' maps. A captured graph reads its inputs from fixed addresses, so the host
batch (engine.batch.HostBatch), the staging copy and each graph's views must agree on the order
and length of every segment: INT64_SEGMENTS and INT32_SEGMENTS give the order, GraphLayout the
lengths for one graph, and segment_offsets puts each segment on a 16-byte boundary. A segment of
length 0 takes no room, so a batch that leaves one out (no tile map on a decode step) keeps the
offsets of the segments before and after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.host_staging import segment_offsets

INT64_SEGMENTS = ("input_ids", "positions", "slot_mapping", "logits_indices")
INT32_SEGMENTS = ("seq_lens", "query_start_loc", "block_tables", "decode_chunk", "tile_seq", "tile_start")


@dataclass(frozen=True)
class GraphLayout:
    """The segment lengths of one graph's inputs."""

    tokens: int  # token rows: input_ids, positions, slot_mapping
    seqs: int  # sequence rows: seq_lens, query_start_loc (one more), block_tables
    table_width: int  # block-table columns (max_blocks_per_seq)
    decode_chunk: int = 0  # 1: room for the decode kernel's fair share (kernels.decode_split)
    tiles: int = 0  # length of the prefill kernel's tile map (kernels.prefill_tiles)

    def int64_lengths(self, num_sampled: int) -> tuple[int, ...]:
        """In INT64_SEGMENTS order; the logits rows follow the step's sampled count."""
        return (self.tokens, self.tokens, self.tokens, num_sampled)

    def int32_lengths(self) -> tuple[int, ...]:
        """In INT32_SEGMENTS order."""
        seqs = self.seqs
        return (seqs, seqs + 1, seqs * self.table_width, self.decode_chunk, self.tiles, self.tiles)

    def int64_extent(self) -> int:
        """Elements of the int64 buffer this layout uses, with a logits row per sequence row."""
        return segment_offsets(list(self.int64_lengths(self.seqs)), 8)[1]

    def int32_extent(self) -> int:
        return segment_offsets(list(self.int32_lengths()), 4)[1]


class StaticBuffers:
    """One int64 and one int32 device buffer, large enough for every layout they serve."""

    def __init__(self, layouts: list[GraphLayout], device: torch.device) -> None:
        self.int64 = torch.zeros(max(layout.int64_extent() for layout in layouts), dtype=torch.int64, device=device)
        self.int32 = torch.zeros(max(layout.int32_extent() for layout in layouts), dtype=torch.int32, device=device)

    def segments(self, layout: GraphLayout) -> dict[str, torch.Tensor]:
        """Views of the layout's segments by name (logits_indices excluded: see logits_rows).
        block_tables is [seqs, table_width]; the others are flat."""
        views: dict[str, torch.Tensor] = {}
        for buffer, names, lengths in ((self.int64, INT64_SEGMENTS[:-1], layout.int64_lengths(0)[:-1]),
                                       (self.int32, INT32_SEGMENTS, layout.int32_lengths())):
            offsets, _ = segment_offsets(list(lengths), buffer.dtype.itemsize)
            for name, start, length in zip(names, offsets, lengths):
                views[name] = buffer[start: start + length]
        views["block_tables"] = views["block_tables"].view(layout.seqs, layout.table_width)
        return views

    def logits_rows(self, layout: GraphLayout, num_sampled: int) -> torch.Tensor:  # [num_sampled] int64
        """The step's logits row indices, staged after the layout's token rows."""
        (*_, start), _ = segment_offsets(list(layout.int64_lengths(num_sampled)), 8)
        return self.int64[start: start + num_sampled]

    @staticmethod
    def pad(segments: dict[str, torch.Tensor]) -> None:
        """Fill the rows every graph pads alike: token 0 at position 0, cache slot -1 (the store
        kernel skips it: warm-up and capture runs must not write the cache), context 0, block 0."""
        segments["input_ids"].zero_()
        segments["positions"].zero_()
        segments["slot_mapping"].fill_(-1)
        segments["seq_lens"].zero_()
        segments["block_tables"].zero_()
