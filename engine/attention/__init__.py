"""Attention over the paged KV cache: metadata, the backend interface, and backends by name."""

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata, make_metadata, slot_mapping_for
from engine.attention.registry import ATTENTION_BACKENDS, get_attention_backend

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "AttentionMetadata",
    "get_attention_backend",
    "make_metadata",
    "slot_mapping_for",
]
