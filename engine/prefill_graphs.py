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
buffers that the runner fills with one host copy per dtype, laid out as HostBatch lays out a
batch (see `views`). The graphs share one memory pool with the decode graphs (engine.cuda_graph),
the largest captured first.

With capture=False nothing is captured: "replay" runs the model over the same static buffers
eagerly, which is how CPU tests check the padding and the layout.
"""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from engine.core.graph_sizes import padded_size
from engine.cuda_graph import capture_sizes
from engine.host_staging import segment_offsets
from kernels.prefill_tiles import max_tiles, tile_shape


class PrefillGraphs:
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
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = tuple(sorted(sizes))
        self.max_tokens = self.sizes[-1]
        self.max_num_seqs = max_num_seqs
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_seq_len = max_seq_len
        self.group = group
        self.device = device
        self.captured = capture
        # NOTE: the largest size need not need the most tiles (a longer query takes larger tiles)
        self.int64 = torch.zeros(max(self._offsets64(t, self.seqs(t))[1] for t in self.sizes), dtype=torch.int64,
                                 device=device)
        self.int32 = torch.zeros(max(self._offsets32(t)[1] for t in self.sizes), dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def padded_size(self, num_tokens: int) -> int | None:
        """The graph that serves a step of num_tokens tokens, None if it is too large."""
        return padded_size(self.sizes, num_tokens)

    def seqs(self, size: int) -> int:
        return min(size, self.max_num_seqs)

    def block_q(self, size: int) -> int:
        return tile_shape(self.group, size, self.kv_caches[0][0].element_size()).block_q

    def num_tiles(self, size: int) -> int:
        return max_tiles(size, self.seqs(size), self.block_q(size))

    def views(self, size: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids, positions, metadata) of graph `size`, as views into the static buffers."""
        s, w, tiles = self.seqs(size), self.max_blocks_per_seq, self.num_tiles(size)
        (ids, pos, slots, _), _ = self._offsets64(size, 0)
        (lens, qsl, tables, tile_seq, tile_start), _ = self._offsets32(size)
        meta = AttentionMetadata(
            slot_mapping=self.int64[slots: slots + size],
            query_start_loc=self.int32[qsl: qsl + s + 1],
            seq_lens=self.int32[lens: lens + s],
            block_tables=self.int32[tables: tables + s * w].view(s, w),
            max_query_len=size,  # selects the tile the map was built for
            max_seq_len=self.max_seq_len,
            is_decode_only=False,
            tile_seq=self.int32[tile_seq: tile_seq + tiles],
            tile_start=self.int32[tile_start: tile_start + tiles],
        )
        return self.int64[ids: ids + size], self.int64[pos: pos + size], meta

    def logits_rows(self, size: int, num_sampled: int) -> torch.Tensor:
        """The step's logits row indices, staged after graph `size`'s int64 inputs."""
        (*_, start), _ = self._offsets64(size, num_sampled)
        return self.int64[start: start + num_sampled]

    def _offsets64(self, size: int, num_sampled: int) -> tuple[list[int], int]:
        # NOTE: engine.runner.HostBatch.int64_arrays order
        return segment_offsets([size, size, size, num_sampled], 8)

    def _offsets32(self, size: int) -> tuple[list[int], int]:
        # NOTE: engine.runner.HostBatch.int32_arrays order, tile map included
        s, tiles = self.seqs(size), self.num_tiles(size)
        return segment_offsets([s, s + 1, s * self.max_blocks_per_seq, tiles, tiles], 4)

    def run(self, size: int) -> torch.Tensor:  # [size, hidden]; rows past the step's tokens are padding
        """Replay graph `size` over what the runner staged in the buffers."""
        if self.captured:
            self.graphs[size].replay()
            return self.outputs[size]
        ids, positions, meta = self.views(size)
        return self.model(ids, positions, self.kv_caches, meta)

    def _set_padding(self, size: int) -> None:
        ids, positions, meta = self.views(size)
        ids.zero_()
        positions.zero_()
        meta.slot_mapping.fill_(-1)  # the warm-up and capture runs must not write the cache
        meta.seq_lens.zero_()
        meta.query_start_loc.zero_()
        meta.block_tables.zero_()
        meta.tile_seq.fill_(-1)
        meta.tile_start.zero_()

    def capture(self, pool=None) -> None:
        """Capture every size (engine.cuda_graph.capture_sizes) into `pool` or a new one."""
        if self.captured:
            self.pool = capture_sizes(self, pool)
