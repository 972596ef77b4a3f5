"""Host-side argument checks shared by the kernel wrappers (shapes and dtypes only: no device syncs,
so the wrappers stay CUDA-graph capturable)."""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Caches narrower than the model's dtype: the store kernel casts new K/V into them and the
# attention kernels convert what they read (to fp16 for fp8: kernels/decode_attention.py).
NARROW_CACHE_DTYPES = (torch.float8_e4m3fn,)

# The attention kernels take exp2 of scores pre-multiplied by scale * log2(e) (cheaper than exp).
LOG2E = 1.4426950408889634


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension")


def check_cache_pair(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Both caches [num_blocks, block_size, num_kv_heads, head_dim], same dtype, linear slots."""
    if k_cache.dim() != 4:
        raise ValueError(
            "k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)}"
        )
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(
            f"v_cache must match k_cache in shape and strides, got {tuple(v_cache.shape)} "
            f"vs {tuple(k_cache.shape)}"
        )
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in SUPPORTED_DTYPES + NARROW_CACHE_DTYPES:
        raise TypeError(
            f"cache dtype must be one of {SUPPORTED_DTYPES + NARROW_CACHE_DTYPES} and equal for k and v, got "
            f"{k_cache.dtype} and {v_cache.dtype}"
        )
    check_last_dim_contiguous("k_cache", k_cache)
    # NOTE: kernels address a slot as slot * stride(1), which needs blocks laid end to end.
    if k_cache.stride(0) != k_cache.shape[1] * k_cache.stride(1):
        raise ValueError("k_cache blocks must be contiguous: stride(0) == block_size * stride(1)")


def check_query(q: torch.Tensor, k_cache: torch.Tensor) -> int:
    """q [num_tokens, num_heads, head_dim] against the cache; returns the GQA group size."""
    if q.dim() != 3 or q.shape[2] != k_cache.shape[3]:
        raise ValueError(
            f"q must be [num_tokens, num_heads, head_dim={k_cache.shape[3]}], got {tuple(q.shape)}"
        )
    if q.dtype != k_cache.dtype and not (k_cache.dtype in NARROW_CACHE_DTYPES and q.dtype in SUPPORTED_DTYPES):
        raise TypeError(f"q.dtype {q.dtype} must equal the cache dtype {k_cache.dtype}")
    if k_cache.shape[3] < 16:  # tl.dot's smallest operand
        raise ValueError(f"head_dim must be >= 16 for the Triton attention kernels, got {k_cache.shape[3]}")
    num_kv_heads = k_cache.shape[2]
    if q.shape[1] % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({q.shape[1]}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    check_last_dim_contiguous("q", q)
    return q.shape[1] // num_kv_heads


def check_int_tensor(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}.dtype must be int32 or int64, got {t.dtype}")


def check_block_tables(block_tables: torch.Tensor, num_seqs: int) -> None:
    """[num_seqs, max_blocks_per_seq] int32/int64; rows are read at stride(0), entries contiguous."""
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables must be [num_seqs={num_seqs}, max_blocks_per_seq], "
            f"got {tuple(block_tables.shape)}"
        )
    check_int_tensor("block_tables", block_tables, tuple(block_tables.shape))
    check_last_dim_contiguous("block_tables", block_tables)
