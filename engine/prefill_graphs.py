"""CUDA graphs of prefill and mixed steps, one per token count, replayed with padding.

Eagerly, a small prefill step is bound by its Python launches, not by the device: 12.7 ms of
host time for a 256-token forward of Qwen3-0.6B on H100, ~30 us per Triton launch and 450 us per
layer (experiments/prefill_graphs/). A step of n tokens that is not decode-only replays instead
the graph of the smallest captured size T >= n (engine.core.graph_sizes): one launch.

Graph T holds T token rows and S = min(T, max_num_seqs) sequence rows. Token rows n..T-1 are
padding (token 0, position 0, cache slot -1: the store kernel skips it), and so are sequence
rows past the step's (no query tokens, context 0); padding rows' hidden states are never read.
Attention runs the Triton prefill kernel over a tile map of fixed length (kernels.prefill_tiles,
built per step by the runner), so the grid does not follow the batch. Inputs come from static
buffers that the runner fills with one host copy per dtype (engine.graph_buffers); capture and
replay are engine.graph_capture's. The graphs share one memory pool with the decode graphs
(engine.cuda_graph), the largest captured first.
"""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from engine.core.graph_sizes import padded_size
from engine.graph_buffers import GraphLayout
from engine.graph_capture import GraphSet
from kernels.prefill_tiles import max_tiles, tile_shape


class PrefillGraphs(GraphSet):
    def __init__(
        self,
        model: torch.nn.Module,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        sizes: tuple[int, ...],
        max_num_seqs: int,
        max_blocks_per_seq: int,
        max_seq_len: int,
        group: int,  # query heads per KV head: sets the attention tile (kernels.prefill_tiles)
        device: torch.device,
        capture: bool = True,
    ) -> None:
        if not sizes:
            raise ValueError("PrefillGraphs needs at least one token count")
        self.max_num_seqs = max_num_seqs
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_seq_len = max_seq_len
        self.group = group
        # NOTE: the largest size need not need the most tiles (a longer query takes larger
        # tiles): the buffers are sized over every layout
        super().__init__(model, kv_caches, tuple(sizes), device, capture)
        self.max_tokens = self.sizes[-1]

    def padded_size(self, num_tokens: int) -> int | None:
        """The graph that serves a step of num_tokens tokens, None if it is too large."""
        return padded_size(self.sizes, num_tokens)

    def seqs(self, size: int) -> int:
        return min(size, self.max_num_seqs)

    def block_q(self, size: int) -> int:
        return tile_shape(self.group, size, self.kv_caches[0][0].element_size()).block_q

    def num_tiles(self, size: int) -> int:
        return max_tiles(size, self.seqs(size), self.block_q(size))

    def layout(self, size: int) -> GraphLayout:
        return GraphLayout(tokens=size, seqs=self.seqs(size), table_width=self.max_blocks_per_seq,
                           tiles=self.num_tiles(size))

    def metadata(self, size: int, segments: dict[str, torch.Tensor]) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=segments["slot_mapping"],
            query_start_loc=segments["query_start_loc"],
            seq_lens=segments["seq_lens"],
            block_tables=segments["block_tables"],
            max_query_len=size,  # selects the tile the map was built for
            max_seq_len=self.max_seq_len,
            is_decode_only=False,
            tile_seq=segments["tile_seq"],
            tile_start=segments["tile_start"],
        )

    def pad_extra(self, size: int, segments: dict[str, torch.Tensor]) -> None:
        segments["query_start_loc"].zero_()
        segments["tile_seq"].fill_(-1)
        segments["tile_start"].zero_()

    def run(self, size: int) -> torch.Tensor:  # [size, hidden]; rows past the step's tokens are padding
        """Replay graph `size` over what the runner staged in the buffers."""
        return self.replay(size)
