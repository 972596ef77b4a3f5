"""AttentionMetadata for backend tests."""

from __future__ import annotations

from types import SimpleNamespace

from tests.kernels.paged_batch import PagedBatch


def make_meta(**fields):
    try:  # the engine's own type once it exists; the backends only read these attributes
        from engine.attention.metadata import AttentionMetadata
    except ImportError:
        return SimpleNamespace(**fields)
    return AttentionMetadata(**fields)


def meta_for(batch: PagedBatch, is_decode_only: bool):
    return make_meta(
        slot_mapping=batch.slot_mapping,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_tables=batch.block_tables,
        max_query_len=batch.max_query_len,
        max_seq_len=batch.max_seq_len,
        is_decode_only=is_decode_only,
    )
