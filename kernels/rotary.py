"""Qwen3's per-head q/k RMSNorm and the rotary embedding, applied to q and k in place, in one
kernel with one program per token.
The same launch can also write the rotated k and v into the paged KV cache (store=), which
saves the separate store kernel.

The unfused path spends ~36 launches a layer here (two per-head norms of ~9 ops each, two
rotations of ~9 ops each); this reads each q and k element once and writes it once. q and k may
be strided views of the fused qkv projection output ([tokens, heads, head_dim] with the last
dimension contiguous): they are rotated where they lie, so no copy is made.

Rotation is the rotate-half form: for each head, (x1, x2) = (x[:half], x[half:]) becomes
(x1 * cos - x2 * sin, x2 * cos + x1 * sin), with cos/sin [tokens, head_dim / 2] float32 looked up
by absolute position. Without norm weights only the rotation is applied (Qwen2, Llama). Math in
float32, one rounding to the I/O dtype. CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.store_kvcache import check_store, saturate_to_cache
from kernels.validation import NARROW_CACHE_DTYPES, SUPPORTED_DTYPES


@triton.jit
def _norm_rope_heads(
    x_ptr, stride_h, w_ptr, cos, sin, n_heads, eps,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, HAS_NORM: tl.constexpr,
):
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < n_heads) & (d < HALF)
    lo = x_ptr + h * stride_h + d  # [BLOCK_H, BLOCK_HALF]: first half of each head
    x1 = tl.load(lo, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(lo + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        sum_sq = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)  # [BLOCK_H]
        rstd = (1.0 / tl.sqrt(sum_sq / (2 * HALF) + eps))[:, None]
        w1 = tl.load(w_ptr + d, mask=d < HALF, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + d, mask=d < HALF, other=0.0).to(tl.float32)
        x1 = x1 * rstd * w1
        x2 = x2 * rstd * w2
    out_ty = x_ptr.dtype.element_ty
    y1 = (x1 * cos - x2 * sin).to(out_ty)
    y2 = (x2 * cos + x1 * sin).to(out_ty)
    tl.store(lo, y1, mask=mask)
    tl.store(lo + HALF, y2, mask=mask)
    return y1, y2


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr,
    v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_ct,
    stride_vt, stride_vh, stride_slot, stride_ch,
    num_q_heads, num_kv_heads, eps,
    HALF: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
    HAS_NORM: tl.constexpr, STORE: tl.constexpr, SATURATE: tl.constexpr, CACHE_MAX: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_ptr + tok * stride_ct + d, mask=d < HALF, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + tok * stride_ct + d, mask=d < HALF, other=0.0).to(tl.float32)
    _norm_rope_heads(q_ptr + tok * stride_qt, stride_qh, qw_ptr, cos, sin, num_q_heads, eps,
                     HALF, BLOCK_QH, BLOCK_HALF, HAS_NORM)
    k1, k2 = _norm_rope_heads(k_ptr + tok * stride_kt, stride_kh, kw_ptr, cos, sin, num_kv_heads, eps,
                              HALF, BLOCK_KH, BLOCK_HALF, HAS_NORM)
    if STORE:
        # the paged-cache write of kernels.store_kvcache, from the rotated k still in registers
        slot = tl.load(slot_ptr + tok).to(tl.int64)
        if slot >= 0:  # padded tokens carry slot -1
            h = tl.arange(0, BLOCK_KH)[:, None]
            mask = (h < num_kv_heads) & (d < HALF)
            k_dst = k_cache_ptr + slot * stride_slot + h * stride_ch + d
            tl.store(k_dst, saturate_to_cache(k1, SATURATE, CACHE_MAX, k_cache_ptr), mask=mask)
            tl.store(k_dst + HALF, saturate_to_cache(k2, SATURATE, CACHE_MAX, k_cache_ptr), mask=mask)
            v_src = v_ptr + tok * stride_vt + h * stride_vh + d
            v_dst = v_cache_ptr + slot * stride_slot + h * stride_ch + d
            for part in tl.static_range(2):
                v = tl.load(v_src + part * HALF, mask=mask, other=0.0)
                tl.store(v_dst + part * HALF, saturate_to_cache(v, SATURATE, CACHE_MAX, v_cache_ptr), mask=mask)


def _check(q, k, cos, sin, q_weight, k_weight) -> None:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q, k must be [tokens, heads, head_dim] with equal tokens and head_dim, "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    tokens, _, head_dim = q.shape
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embedding, got {head_dim}")
    if q.dtype != k.dtype or q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q and k must share a dtype in {SUPPORTED_DTYPES}, got {q.dtype} and {k.dtype}")
    if q.stride(2) != 1 or k.stride(2) != 1:
        raise ValueError("q and k must be contiguous in their last (head_dim) dimension")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (tokens, head_dim // 2) or t.dtype != torch.float32 or t.stride(1) != 1:
            raise ValueError(f"{name} must be float32 [{tokens}, {head_dim // 2}] with a contiguous last "
                             f"dimension, got {t.dtype} {tuple(t.shape)}")
    if cos.stride(0) != sin.stride(0):
        raise ValueError("cos and sin must share their row stride")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("q_weight and k_weight must be given together (q/k norm) or both be None")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if w is not None and (w.shape != (head_dim,) or w.stride(0) != 1):
            raise ValueError(f"{name} must be a contiguous [{head_dim}] tensor, got {tuple(w.shape)}")


def qk_norm_rope_(
    q: torch.Tensor,  # [tokens, num_heads, head_dim], rotated in place
    k: torch.Tensor,  # [tokens, num_kv_heads, head_dim], rotated in place
    cos: torch.Tensor,  # [tokens, head_dim / 2] float32
    sin: torch.Tensor,  # [tokens, head_dim / 2] float32
    q_weight: torch.Tensor | None = None,  # [head_dim]: per-head RMSNorm of q first (Qwen3)
    k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    store: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """rope(rms_norm(q)), rope(rms_norm(k)) written over q and k; returns (q, k).

    store = (v, k_cache, v_cache, slot_mapping): also write the rotated k and v into the paged
    cache, as kernels.store_kvcache would (one launch fewer per layer)."""
    _check(q, k, cos, sin, q_weight, k_weight)
    if store is not None:
        check_store(k, *store)
    tokens, num_heads, head_dim = q.shape
    if tokens == 0:
        return q, k
    half = head_dim // 2
    has_norm = q_weight is not None
    v, k_cache, v_cache, slots = store if store is not None else (k, k, k, cos)  # unused when not storing
    _qk_norm_rope_kernel[(tokens,)](
        q, k, cos, sin, q_weight if has_norm else cos, k_weight if has_norm else cos,
        v, k_cache, v_cache, slots,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0),
        v.stride(0), v.stride(1), k_cache.stride(-3), k_cache.stride(-2),
        num_heads, k.shape[1], eps,
        HALF=half, BLOCK_QH=triton.next_power_of_2(num_heads), BLOCK_KH=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half), HAS_NORM=has_norm, STORE=store is not None,
        SATURATE=k_cache.dtype in NARROW_CACHE_DTYPES, CACHE_MAX=torch.finfo(k_cache.dtype).max, num_warps=4,
    )  # fmt: skip
    return q, k
