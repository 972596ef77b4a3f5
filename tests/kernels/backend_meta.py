"""AttentionMetadata for backend tests, built from a PagedBatch."""

from __future__ import annotations

from engine.attention.metadata import AttentionMetadata
from tests.kernels.paged_batch import PagedBatch


def meta_for(batch: PagedBatch, is_decode_only: bool) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=batch.slot_mapping,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_tables=batch.block_tables,
        max_query_len=batch.max_query_len,
        max_seq_len=batch.max_seq_len,
        is_decode_only=is_decode_only,
    )
