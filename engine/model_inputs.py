"""A step's inputs on the device: its HostBatch uploaded, one copy per dtype (engine.host_staging).

A step that a CUDA graph serves is copied straight into that graph's static buffers
(engine.graph_buffers) and reads its inputs as views of them; any other step gets fresh tensors
and metadata of its own shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.metadata import AttentionMetadata
from engine.batch import HostBatch
from engine.host_staging import HostStaging


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [token rows] int64
    positions: torch.Tensor  # [token rows] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampled] int64
    sample_rows: list[int]
    num_seqs: int = 0
    graph_size: int | None = None  # the decode graph that runs the step
    prefill_graph: int | None = None  # the prefill graph that runs the step


def upload_batch(staging: HostStaging, batch: HostBatch, decode_graphs=None, prefill_graphs=None) -> ModelInputs:
    """The batch on the device; decode_graphs / prefill_graphs are the graph sets whose sizes
    build_host_batch padded it to."""
    graphs, size = (decode_graphs, batch.graph_size) if batch.graph_size else (prefill_graphs, batch.prefill_graph)
    if size:
        staging.upload(batch.int64_arrays(), torch.int64, out=graphs.buffers.int64)
        staging.upload(batch.int32_arrays(), torch.int32, out=graphs.buffers.int32)
        ids, pos, meta = graphs.views(size)
        rows = graphs.logits_rows(size, len(batch.sample_rows))
        return ModelInputs(ids, pos, meta, rows, batch.sample_rows, batch.num_seqs, batch.graph_size,
                           batch.prefill_graph)
    ids, pos, slots, rows = staging.upload(batch.int64_arrays(), torch.int64)
    lens, qsl, tables, *chunk = staging.upload(batch.int32_arrays(), torch.int32)
    meta = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=qsl,
        seq_lens=lens,
        block_tables=tables,
        max_query_len=batch.max_query_len,
        max_seq_len=batch.max_seq_len,
        is_decode_only=batch.max_query_len == 1,
        decode_chunk=chunk[0] if chunk else None,
    )
    return ModelInputs(ids, pos, meta, rows, batch.sample_rows, batch.num_seqs)
