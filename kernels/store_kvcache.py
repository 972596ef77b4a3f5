"""Scatter this step's K/V rows into the paged cache (one program per token)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.validation import NARROW_CACHE_DTYPES, check_cache_pair, check_last_dim_contiguous


@triton.jit
def _store_kvcache_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_slot,
    stride_ch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SATURATE: tl.constexpr,  # saturate_to_cache
    CACHE_MAX: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    # NOTE: padded tokens (CUDA-graph padding, dummy rows) carry slot -1 and must not touch the
    # cache: slot 0 belongs to a live sequence.
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h < NUM_KV_HEADS)[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(k_ptr + tok * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    dst = slot * stride_slot + h[:, None] * stride_ch + d[None, :]
    tl.store(k_cache_ptr + dst, saturate_to_cache(k, SATURATE, CACHE_MAX, k_cache_ptr), mask=mask)
    tl.store(v_cache_ptr + dst, saturate_to_cache(v, SATURATE, CACHE_MAX, v_cache_ptr), mask=mask)


@triton.jit
def saturate_to_cache(x, SATURATE: tl.constexpr, CACHE_MAX: tl.constexpr, cache_ptr):
    """x in the cache's dtype; a narrow cache (fp8, SATURATE) clamps to +-CACHE_MAX first, which a
    plain cast could overflow."""
    if SATURATE:
        x = tl.clamp(x.to(tl.float32), -CACHE_MAX, CACHE_MAX)
    return x.to(cache_ptr.dtype.element_ty)


def check_store(k, v, k_cache, v_cache, slot_mapping) -> None:
    """store_kvcache's arguments (also those of the store fused into kernels.rotary)."""
    check_cache_pair(k_cache, v_cache)
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 3 or tuple(t.shape[1:]) != tuple(k_cache.shape[2:]):
            raise ValueError(
                f"{name} must be [num_tokens, {k_cache.shape[2]}, {k_cache.shape[3]}] to match the "
                f"cache, got {tuple(t.shape)}"
            )
        if t.dtype != k_cache.dtype and k_cache.dtype not in NARROW_CACHE_DTYPES:
            raise TypeError(f"{name}.dtype {t.dtype} must equal the cache dtype {k_cache.dtype}")
        check_last_dim_contiguous(name, t)
    if k.shape[0] != v.shape[0] or slot_mapping.shape != (k.shape[0],):
        raise ValueError(
            f"slot_mapping must be [num_tokens={k.shape[0]}] like k and v, got "
            f"{tuple(slot_mapping.shape)} (v has {v.shape[0]} tokens)"
        )
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"slot_mapping.dtype must be int32 or int64, got {slot_mapping.dtype}")


def store_kvcache(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, < 0 = skip
) -> None:
    """Write k[i], v[i] into cache slot slot_mapping[i] for every i with a non-negative slot. An fp8
    cache takes k and v of any float dtype, saturated to its range (a scale of 1)."""
    check_store(k, v, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    _store_kvcache_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(1),
        k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        SATURATE=k_cache.dtype in NARROW_CACHE_DTYPES,
        CACHE_MAX=torch.finfo(k_cache.dtype).max,
        num_warps=4,
    )
