"""Attention over the paged KV cache: metadata, the backend interface, and backends by name.

The names below load on first use, so that reading the backends' names
(engine.attention.registry, which engine.config validates against) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    from engine.attention.backend import AttentionBackend
    from engine.attention.metadata import AttentionMetadata, make_metadata, slot_mapping_for
    from engine.attention.registry import ATTENTION_BACKENDS, get_attention_backend

    exports = {"ATTENTION_BACKENDS": ATTENTION_BACKENDS, "AttentionBackend": AttentionBackend,
               "AttentionMetadata": AttentionMetadata, "get_attention_backend": get_attention_backend,
               "make_metadata": make_metadata, "slot_mapping_for": slot_mapping_for}
    if name not in exports:
        raise AttributeError(f"module 'engine.attention' has no attribute {name!r}")
    return exports[name]
