"""CUDA graphs of the decode forward, one per batch size, replayed with padding.

A decode step of n sequences replays the graph of the smallest captured size bs >= n. Rows
n..bs-1 are padding: token 0 at position 0, cache slot -1 (the store kernel skips it) and context
length 0 (the decode kernel gives zeros for it and reads no cache). Their hidden states are never
used. Inputs come from the static buffers of engine.graph_buffers; capture and replay are
engine.graph_capture's.

Sizes come from engine.core.graph_sizes.decode_graph_sizes (the simulator prices steps with the
same rule): up to max_num_seqs, capped at ExecutionConfig.max_graph_batch_size. Every graph
shares one memory pool, and the largest is captured first so the pool is sized by it. Larger
batches run eagerly; prefill and mixed steps have graphs of their own (engine.prefill_graphs),
captured first into the same pool.

"""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from engine.core.graph_sizes import padded_size as padded_graph_size
from engine.graph_buffers import GraphLayout
from engine.graph_capture import GraphSet


class DecodeGraphs(GraphSet):
    def __init__(
        self,
        model: torch.nn.Module,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        sizes: list[int],
        max_blocks_per_seq: int,
        max_seq_len: int,
        device: torch.device,
        capture: bool = True,
        balanced: bool = False,  # the steps pass the decode kernel a fair share (HostBatch.decode_chunk)
    ) -> None:
        self.max_blocks_per_seq = max_blocks_per_seq
        # NOTE: the decode kernel picks its split count from this host int at capture time; the
        # longest context a replay may see keeps long contexts parallel at small batch sizes.
        self.max_seq_len = max_seq_len
        self.balanced = balanced
        super().__init__(model, kv_caches, tuple(sizes), device, capture)
        self.max_batch = self.sizes[-1]

    def padded_size(self, num_seqs: int) -> int | None:
        """The graph that serves a decode batch of num_seqs rows, None if it is too large."""
        return padded_graph_size(self.sizes, num_seqs)

    def layout(self, bs: int) -> GraphLayout:
        # the fair-share slot is kept whether or not the steps fill it
        return GraphLayout(tokens=bs, seqs=bs, table_width=self.max_blocks_per_seq, decode_chunk=1)

    def metadata(self, bs: int, segments: dict[str, torch.Tensor]) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=segments["slot_mapping"],
            query_start_loc=segments["query_start_loc"],
            seq_lens=segments["seq_lens"],
            block_tables=segments["block_tables"],
            max_query_len=1,
            max_seq_len=self.max_seq_len,
            is_decode_only=True,
            decode_chunk=segments["decode_chunk"] if self.balanced else None,
        )

    def pad_extra(self, bs: int, segments: dict[str, torch.Tensor]) -> None:
        segments["query_start_loc"].copy_(torch.arange(bs + 1, dtype=torch.int32, device=self.device))
        if self.balanced:
            segments["decode_chunk"].zero_()  # the kernel takes the even rule's chunk when larger

    def run(self, bs: int, num_seqs: int) -> torch.Tensor:  # [num_seqs, hidden]
        """Replay graph bs over what the runner staged in the buffers; real rows only."""
        return self.replay(bs)[:num_seqs]
