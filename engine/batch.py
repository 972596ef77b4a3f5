"""A step's model inputs as host arrays, built from its StepPlan without a per-token Python loop.

For a decode step that a decode graph serves, the rows are padded to the graph's batch size:
token 0, position 0, slot -1, context length 0, and the block tables are max_blocks_per_seq
wide. For a prefill or mixed step that a prefill graph serves, token rows are padded to the
graph's token count and sequence rows to its sequence count (no query tokens, context 0), and a
tile map comes along. The arrays are what the driver sends to the other tensor-parallel ranks;
their order in each dtype's upload is engine.graph_buffers' layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from engine.core.plan import StepPlan
from engine.graph_buffers import INT32_SEGMENTS, INT64_SEGMENTS
from kernels.decode_split import balanced_chunk
from kernels.prefill_tiles import query_tiles

if TYPE_CHECKING:
    from engine.sharded_sampling import ShardDraw


@dataclass
class HostBatch:
    input_ids: np.ndarray  # [token rows] int64
    positions: np.ndarray  # [token rows] int64
    slot_mapping: np.ndarray  # [token rows] int64, -1 on padding rows
    logits_indices: np.ndarray  # [num_sampled] int64, row of hidden for each sampling request
    seq_lens: np.ndarray  # [seq rows] int32
    query_start_loc: np.ndarray  # [seq rows + 1] int32
    block_tables: np.ndarray  # [seq rows, width] int32
    max_query_len: int
    max_seq_len: int
    num_seqs: int  # real sequences (rows past it are graph padding)
    graph_size: int | None  # the decode graph that serves the step
    sample_rows: list[int]  # index into plan.scheduled of each sampling request
    prefill_graph: int | None = None  # the prefill graph that serves the step
    tile_seq: np.ndarray | None = None  # [graph's tile count] int32 (kernels.prefill_tiles)
    tile_start: np.ndarray | None = None  # [graph's tile count] int32
    decode_chunk: np.ndarray | None = None  # [1] int32, decode steps on CUDA (kernels.decode_split)
    # tensor parallelism: the step's draw when every rank samples its vocabulary slice (engine.runner)
    draw: ShardDraw | None = None

    def int64_arrays(self) -> list[np.ndarray]:
        return [getattr(self, name) for name in INT64_SEGMENTS]

    def int32_arrays(self) -> list[np.ndarray]:
        """The segments this batch has (no tile map on decode steps, no fair share elsewhere)."""
        return [array for array in map(self.__getattribute__, INT32_SEGMENTS) if array is not None]


def _num_computed(entry) -> int:
    return entry.num_computed_tokens


def _graph_rows(n: int, num_tokens: int, decode_graphs, prefill_graphs) -> tuple[int | None, int | None, int, int]:
    """(decode graph, prefill graph, token rows, sequence rows) of a step of n sequences."""
    decode_only = num_tokens == n
    graph_size = decode_graphs.padded_size(n) if decode_graphs is not None and decode_only else None
    prefill_graph = None
    if prefill_graphs is not None and not decode_only:
        prefill_graph = prefill_graphs.padded_size(num_tokens)
    # graph steps carry padding rows past the step's tokens and sequences
    token_rows = graph_size or prefill_graph or num_tokens
    seq_rows = graph_size or (prefill_graphs.seqs(prefill_graph) if prefill_graph else n)
    return graph_size, prefill_graph, token_rows, seq_rows


def _block_tables(tables: list[list[int]], blocks_needed: np.ndarray, width: int, seq_rows: int) -> np.ndarray:
    """[seq_rows, width] int32, each row the blocks that hold its context, padded with block 0."""
    # Only the blocks that hold context matter; a chunked prompt's table may reach further.
    total_blocks = int(blocks_needed.sum())
    if sum(map(len, tables)) == total_blocks:  # the usual case: tables hold exactly the context
        flat_tables = np.fromiter(chain.from_iterable(tables), np.int64, total_blocks)
    else:
        flat_tables = np.fromiter(chain.from_iterable(t[:c] for t, c in zip(tables, blocks_needed.tolist())),
                                  np.int64, total_blocks)
    block_tables = np.zeros((seq_rows, width), np.int32)
    # a boolean mask fills row-major, the order of flat_tables
    block_tables[: len(tables)][np.arange(width) < blocks_needed[:, None]] = flat_tables
    return block_tables


def build_host_batch(plan: StepPlan, block_size: int, max_blocks_per_seq: int, decode_graphs=None,
                     prefill_graphs=None, decode_split: tuple[int, int] | None = None) -> HostBatch:
    """The step's HostBatch. decode_graphs / prefill_graphs (engine.cuda_graph,
    engine.prefill_graphs) pad the steps they serve; decode_split (KV heads, SMs) adds the
    decode kernel's fair share to decode steps."""
    entries = plan.scheduled
    n = len(entries)
    # NOTE: map/chain over plain lists iterate in C; per-entry generators cost ~3x more.
    token_lists = [e.token_ids for e in entries]
    query_lens = np.fromiter(map(len, token_lists), np.int64, n)  # [n]
    starts = np.fromiter(map(_num_computed, entries), np.int64, n)  # [n]
    seq_lens = starts + query_lens  # [n]
    query_start_loc = np.zeros(n + 1, np.int64)
    np.cumsum(query_lens, out=query_start_loc[1:])
    num_tokens = int(query_start_loc[-1])
    decode_only = num_tokens == n
    graph_size, prefill_graph, token_rows, seq_rows = _graph_rows(n, num_tokens, decode_graphs, prefill_graphs)
    input_ids = np.zeros(token_rows, np.int64)
    input_ids[:num_tokens] = np.fromiter(chain.from_iterable(token_lists), np.int64, num_tokens)
    if decode_only:
        seq_of_token, positions = np.arange(n), starts
    else:
        seq_of_token = np.repeat(np.arange(n), query_lens)  # [num_tokens]
        positions = np.arange(num_tokens) - query_start_loc[seq_of_token] + starts[seq_of_token]
    blocks_needed = (seq_lens + block_size - 1) // block_size  # [n]
    # NOTE: a fixed width for graphs; otherwise a multiple of 16, so that the Triton kernels,
    # which specialise on their integer arguments (the table's row stride among them), are
    # not recompiled in the middle of a run when the widest table changes.
    width = max_blocks_per_seq if graph_size or prefill_graph else -(-int(blocks_needed.max()) // 16) * 16
    block_tables = _block_tables([e.block_table for e in entries], blocks_needed, width, seq_rows)
    slot_mapping = np.full(token_rows, -1, np.int64)
    slot_mapping[:num_tokens] = (block_tables[seq_of_token, positions // block_size].astype(np.int64) * block_size
                                 + positions % block_size)
    sample_rows = [i for i, e in enumerate(entries) if e.sample]
    logits_indices = query_start_loc[1:][sample_rows] - 1
    max_query_len, max_seq_len = int(query_lens.max()), int(seq_lens.max())
    tile_seq = tile_start = None
    if prefill_graph:
        tile_seq, tile_start = query_tiles(query_lens, seq_lens, prefill_graphs.block_q(prefill_graph),
                                           prefill_graphs.num_tiles(prefill_graph))
        query_start_loc = np.concatenate([query_start_loc, np.full(seq_rows - n, num_tokens)])
    elif graph_size:
        query_start_loc = np.arange(seq_rows + 1)
    if token_rows > num_tokens:
        positions = np.concatenate([positions, np.zeros(token_rows - num_tokens, np.int64)])
    decode_chunk = None
    if decode_only and decode_split is not None:
        decode_chunk = np.array([balanced_chunk(seq_lens, *decode_split)], np.int32)
    if seq_rows > n:
        seq_lens = np.concatenate([seq_lens, np.zeros(seq_rows - n, np.int64)])
    return HostBatch(
        input_ids, positions, slot_mapping, logits_indices, seq_lens.astype(np.int32),
        query_start_loc.astype(np.int32), block_tables, max_query_len=max_query_len,
        max_seq_len=max_seq_len, num_seqs=n, graph_size=graph_size, sample_rows=sample_rows,
        prefill_graph=prefill_graph, tile_seq=tile_seq, tile_start=tile_start, decode_chunk=decode_chunk,
    )
