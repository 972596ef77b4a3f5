"""CUDA graphs of the decode forward, one per batch size, replayed with padding.

A decode step of n sequences replays the graph of the smallest captured size bs >= n. The
graphs read their inputs from static device buffers, which the runner fills with one host copy
per dtype (engine.runner.HostBatch is laid out to match: see `views`). Rows n..bs-1 are padding:
token 0 at position 0, cache slot -1 (the store kernel skips it) and context length 0 (the decode
kernel gives zeros for it and reads no cache). Their hidden states are never used.

Sizes follow nano-vllm: 1, 2, 4, 8, then multiples of 16 up to max_num_seqs (capped at
MAX_GRAPH_BATCH); every graph shares one memory pool, and the largest is captured first so the
pool is sized by it. Larger batches run eagerly; prefill and mixed steps have graphs of their own
(engine.prefill_graphs), captured first into the same pool.

With capture=False nothing is captured: "replay" runs the model over the same static buffers
eagerly. CPU tests use it to check the padding and buffer layout without a GPU.
"""

from __future__ import annotations

import bisect

import torch

from engine.attention.metadata import AttentionMetadata
from engine.host_staging import segment_offsets

MAX_GRAPH_BATCH = 512


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, 48, ... up to min(max_num_seqs, MAX_GRAPH_BATCH), which is always included."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    top = min(max_num_seqs, MAX_GRAPH_BATCH)
    sizes = [s for s in (1, 2, 4, 8) if s <= top] + list(range(16, top + 1, 16))
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


class DecodeGraphs:
    def __init__(
        self,
        model: torch.nn.Module,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        sizes: list[int],
        max_blocks_per_seq: int,
        max_seq_len: int,
        device: torch.device,
        capture: bool = True,
        pool=None,  # a graph memory pool to capture into (the prefill graphs'), else a new one
        balanced: bool = False,  # the steps pass the decode kernel a fair share (HostBatch.decode_chunk)
    ) -> None:
        if capture and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sorted(sizes)
        self.max_batch = self.sizes[-1]
        self.max_blocks_per_seq = max_blocks_per_seq
        # NOTE: the decode kernel picks its split count from this host int at capture time; the
        # longest context a replay may see keeps long contexts parallel at small batch sizes.
        self.max_seq_len = max_seq_len
        self.device = device
        self.captured = capture
        self.balanced = balanced
        n = self.max_batch
        # int64: input_ids, positions, slot_mapping of a graph, then the step's logits rows;
        # int32: seq_lens, query_start_loc, block_tables [bs, max_blocks_per_seq], the decode
        # chunk. Laid out as HostStaging lays out a batch, so one copy per dtype fills them.
        self.int64 = torch.zeros(self._offsets64(n, n)[1], dtype=torch.int64, device=device)
        self.int32 = torch.zeros(self._offsets32(n)[1], dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture(pool)

    def padded_size(self, num_seqs: int) -> int | None:
        """The graph that serves a decode batch of num_seqs rows, None if it is too large."""
        if num_seqs > self.max_batch:
            return None
        return self.sizes[bisect.bisect_left(self.sizes, num_seqs)]

    def views(self, bs: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids, positions, metadata) of graph bs, as views into the static buffers."""
        w = self.max_blocks_per_seq
        (ids, pos, slots, _), _ = self._offsets64(bs, 0)
        (lens, qsl, tables, chunk), _ = self._offsets32(bs)
        meta = AttentionMetadata(
            slot_mapping=self.int64[slots: slots + bs],
            query_start_loc=self.int32[qsl: qsl + bs + 1],
            seq_lens=self.int32[lens: lens + bs],
            block_tables=self.int32[tables: tables + bs * w].view(bs, w),
            max_query_len=1,
            max_seq_len=self.max_seq_len,
            is_decode_only=True,
            decode_chunk=self.int32[chunk: chunk + 1] if self.balanced else None,
        )
        return self.int64[ids: ids + bs], self.int64[pos: pos + bs], meta

    def logits_rows(self, bs: int, num_sampled: int) -> torch.Tensor:
        """The step's logits row indices, staged after graph bs's int64 inputs."""
        (*_, start), _ = self._offsets64(bs, num_sampled)
        return self.int64[start: start + num_sampled]

    def _offsets64(self, bs: int, num_sampled: int) -> tuple[list[int], int]:
        return segment_offsets([bs, bs, bs, num_sampled], 8)

    def _offsets32(self, bs: int) -> tuple[list[int], int]:
        return segment_offsets([bs, bs + 1, bs * self.max_blocks_per_seq, 1], 4)

    def run(self, bs: int, num_seqs: int) -> torch.Tensor:  # [num_seqs, hidden]
        """Replay graph bs over what the runner staged in the buffers; real rows only."""
        if self.captured:
            self.graphs[bs].replay()
            return self.outputs[bs][:num_seqs]
        ids, positions, meta = self.views(bs)
        return self.model(ids, positions, self.kv_caches, meta)[:num_seqs]

    def _set_padding(self, bs: int) -> None:
        ids, positions, meta = self.views(bs)
        ids.zero_()
        positions.zero_()
        meta.slot_mapping.fill_(-1)  # the warm-up and capture runs must not write the cache
        meta.seq_lens.zero_()
        meta.query_start_loc.copy_(torch.arange(bs + 1, dtype=torch.int32, device=self.device))
        meta.block_tables.zero_()
        if meta.decode_chunk is not None:
            meta.decode_chunk.zero_()  # the kernel takes the even rule's chunk when larger

    def _capture(self, pool) -> None:
        capture_sizes(self, pool)


@torch.inference_mode()
def capture_sizes(graphs, pool=None):
    """Capture the forward of every size of `graphs` (DecodeGraphs or PrefillGraphs: sizes,
    views(), _set_padding(), model, kv_caches, device; filled: graphs, outputs), largest first so
    that it sizes the memory pool, into `pool` or a new one. Returns the pool."""
    for size in reversed(graphs.sizes):
        graphs._set_padding(size)
        ids, positions, meta = graphs.views(size)
        # Eager run first: lazy initialisation (kernel compilation, library handles, NCCL
        # communicators) must not happen inside the capture.
        graphs.model(ids, positions, graphs.kv_caches, meta)
        torch.cuda.synchronize(graphs.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            graphs.outputs[size] = graphs.model(ids, positions, graphs.kv_caches, meta)
        if pool is None:
            pool = graph.pool()
        graphs.graphs[size] = graph
    torch.cuda.synchronize(graphs.device)
    return pool
