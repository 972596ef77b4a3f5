"""Checks of the fused elementwise and sampling kernels against float32 references, shared by the
GPU tests (device "cuda", every dtype) and the CPU interpreter run (tests/kernels/
interpret_fused.py: device "cpu", float32, TRITON_INTERPRET=1).

Inputs are fresh random tensors per call (the seed is in every failure message). Errors are
measured against the float32 reference of the same (already rounded) inputs: norm-wise relative
error, and the largest elementwise error relative to the largest reference value.
"""

from __future__ import annotations

import numpy as np
import torch

from kernels.elementwise_reference import add_rms_norm_ref, qk_norm_rope_ref, rms_norm_ref, silu_and_mul_ref

# Norm-wise and max-elementwise relative error bounds per I/O dtype (bf16 keeps 8 bits).
TOLERANCE = {torch.bfloat16: (1e-2, 2e-2), torch.float16: (2e-3, 4e-3), torch.float32: (1e-5, 1e-5)}


def assert_close_rel(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    norm_tol, max_tol = TOLERANCE[dtype]
    out, ref = out.float().cpu(), ref.float().cpu()
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    norm_err = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    max_err = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    assert norm_err < norm_tol and max_err < max_tol, f"{what}: relative error {norm_err:.2e} (max {max_err:.2e})"


def _randn(gen: torch.Generator, *shape: int, device: str, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)


def check_rms_norm(device: str, dtype: torch.dtype, tokens: int, dim: int, seed: int) -> None:
    from kernels.rmsnorm import rms_norm

    gen = torch.Generator().manual_seed(seed)
    # rows with very different scales: the norm must remove them
    scales = torch.logspace(-2, 2, tokens).to(dtype).to(device)[:, None]
    x = _randn(gen, tokens, dim, device=device, dtype=dtype) * scales
    w = _randn(gen, dim, device=device, dtype=dtype, scale=0.2) + 1
    out = rms_norm(x, w, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close_rel(out, rms_norm_ref(x, w, 1e-6), dtype, f"rms_norm {tokens}x{dim} {dtype} seed {seed}")


def check_per_head_rms_norm(device: str, dtype: torch.dtype, tokens: int, heads: int, head_dim: int, seed: int) -> None:
    """The 3-D case on a strided view, as q sits in the fused qkv output."""
    from kernels.rmsnorm import rms_norm

    gen = torch.Generator().manual_seed(seed)
    buf = _randn(gen, tokens, (heads + 3) * head_dim, device=device, dtype=dtype, scale=3.0)
    q = buf[:, head_dim: (heads + 1) * head_dim].view(tokens, heads, head_dim)  # strided rows
    before = buf.clone()
    w = _randn(gen, head_dim, device=device, dtype=dtype, scale=0.2) + 1
    out = rms_norm(q, w, 1e-6)
    assert out.shape == q.shape
    assert_close_rel(out, rms_norm_ref(q, w, 1e-6), dtype, f"per-head rms_norm {tokens}x{heads}x{head_dim} seed {seed}")
    assert torch.equal(buf, before), "rms_norm wrote into its input"


def check_add_rms_norm(device: str, dtype: torch.dtype, tokens: int, dim: int, seed: int, terms: int = 0) -> None:
    """terms > 0: x is [tokens, terms, dim], summed by the kernel (a mixture-of-experts layer's top-k)."""
    from kernels.rmsnorm import add_rms_norm

    gen = torch.Generator().manual_seed(seed)
    x = _randn(gen, tokens, *((terms,) if terms else ()), dim, device=device, dtype=dtype)
    residual = _randn(gen, tokens, dim, device=device, dtype=dtype, scale=4.0)
    w = _randn(gen, dim, device=device, dtype=dtype, scale=0.2) + 1
    x0, r0 = x.clone(), residual.clone()
    out, new_residual = add_rms_norm(x, residual, w, 1e-6)
    ref_out, ref_residual = add_rms_norm_ref(x.float().sum(1) if terms else x, residual, w, 1e-6)
    what = f"add_rms_norm {tokens}x{terms or ''}x{dim} {dtype} seed {seed}"
    assert_close_rel(new_residual, ref_residual, dtype, what + " (residual)")
    assert_close_rel(out, ref_out, dtype, what)
    assert torch.equal(x, x0) and torch.equal(residual, r0), "add_rms_norm changed its inputs"


def check_silu_and_mul(device: str, dtype: torch.dtype, tokens: int, inter: int, seed: int) -> None:
    from kernels.activation import silu_and_mul

    gen = torch.Generator().manual_seed(seed)
    x = _randn(gen, tokens, 2 * inter, device=device, dtype=dtype, scale=3.0)
    out = silu_and_mul(x)
    assert out.shape == (tokens, inter) and out.dtype == dtype
    assert_close_rel(out, silu_and_mul_ref(x), dtype, f"silu_and_mul {tokens}x{inter} {dtype} seed {seed}")


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float = 1e6) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def check_qk_norm_rope(device: str, dtype: torch.dtype, tokens: int, heads: int, kv_heads: int, head_dim: int,
                       with_norm: bool, seed: int) -> None:
    """q and k rotated in place inside one qkv buffer; v and everything else left untouched."""
    from kernels.rotary import qk_norm_rope_

    gen = torch.Generator().manual_seed(seed)
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    qkv = _randn(gen, tokens, q_size + 2 * kv_size, device=device, dtype=dtype, scale=2.0)
    q = qkv[:, :q_size].view(tokens, heads, head_dim)
    k = qkv[:, q_size: q_size + kv_size].view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 40960, (tokens,), generator=gen)
    cos, sin = (t.to(device) for t in rope_tables(positions, head_dim))
    qw = kw = None
    if with_norm:
        qw = _randn(gen, head_dim, device=device, dtype=dtype, scale=0.3) + 1
        kw = _randn(gen, head_dim, device=device, dtype=dtype, scale=0.3) + 1
    ref_q, ref_k = qk_norm_rope_ref(q.clone(), k.clone(), cos, sin, qw, kw, 1e-6)
    v_before = qkv[:, q_size + kv_size:].clone()
    out_q, out_k = qk_norm_rope_(q, k, cos, sin, qw, kw, 1e-6)
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr(), "not in place"
    what = f"qk_norm_rope T={tokens} H={heads}/{kv_heads} D={head_dim} norm={with_norm} {dtype} seed {seed}"
    assert_close_rel(q, ref_q, dtype, what + " (q)")
    assert_close_rel(k, ref_k, dtype, what + " (k)")
    assert torch.equal(qkv[:, q_size + kv_size:], v_before), f"{what}: v was written"


def check_gumbel_argmax(device: str, rows: int, vocab: int, with_cutoff: bool, seed: int,
                        dtype: torch.dtype = torch.float32) -> None:
    """The kernel against the torch formula of engine.sampler_noise with the same keys.

    Rows whose reference winner leads the runner-up by a clear margin must match exactly (the
    kernel's float32 log may differ from torch's in the last bit); most rows have one. Greedy
    rows (inverse temperature 0) must be torch.argmax exactly, ties to the lowest index included.
    dtype: what the kernel reads (the logits are multiples of 1/8 in [-5, 5), exact in bfloat16).
    """
    from engine.sampler_noise import key_words, log_exponential
    from kernels.sampling import gumbel_argmax

    gen = torch.Generator().manual_seed(seed)
    # quantised logits: plenty of exact ties for the greedy rows to break
    logits = (torch.randint(-40, 40, (rows, vocab), generator=gen).float() / 8).to(device)
    inv_t = (1.0 / (0.2 + 2 * torch.rand(rows, generator=gen)))
    inv_t[::3] = 0.0  # greedy rows
    inv_t = inv_t.to(device)
    keys = np.random.default_rng(seed).integers(0, 2**64, size=rows, dtype=np.uint64)
    words = torch.from_numpy(key_words(keys)).to(device)
    cutoff = None
    if with_cutoff:
        cutoff = logits.kthvalue(vocab - 5, dim=-1).values  # ~5+ survivors per row
        cutoff[1::4] = float("-inf")
    out = gumbel_argmax(logits.to(dtype), inv_t, words, cutoff)
    assert out.dtype == torch.int64 and out.shape == (rows,)
    greedy = inv_t == 0
    masked = logits if cutoff is None else logits.masked_fill(logits < cutoff[:, None], float("-inf"))
    noise = log_exponential(words.cpu(), vocab).to(device)
    scores = torch.where(greedy[:, None], masked, masked * inv_t[:, None] - noise)
    ref = scores.argmax(dim=-1)
    top2 = scores.topk(2, dim=-1).values
    clear = greedy | (top2[:, 0] - top2[:, 1] > 1e-4)
    assert torch.equal(out[greedy], ref[greedy]), f"greedy rows differ from argmax (seed {seed})"
    assert int((~clear).sum()) <= max(1, rows // 5), f"too few clear rows to test (seed {seed})"
    assert torch.equal(out[clear], ref[clear]), f"sampled rows differ from the reference (seed {seed})"
    if cutoff is not None:
        picked = logits.gather(1, out[:, None]).squeeze(1)
        assert (picked >= cutoff).all(), f"a token below its row's cutoff was drawn (seed {seed})"


def check_qk_norm_rope_store(device: str, dtype: torch.dtype, cache_dtype: torch.dtype, tokens: int, seed: int) -> None:
    """The store fused into qk_norm_rope_ writes exactly what store_kvcache writes after it, in the
    same slots (padding slot -1 skipped), and nothing else of the cache."""
    from kernels.rotary import qk_norm_rope_
    from kernels.store_kvcache import store_kvcache

    gen = torch.Generator().manual_seed(seed)
    heads, kv_heads, head_dim, blocks, page = 16, 8, 128, 32, 16
    # scale 200: values past the fp8 range, which the store saturates
    qkv = _randn(gen, tokens, (heads + 2 * kv_heads) * head_dim, device=device, dtype=dtype, scale=200.0)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))
    cos, sin = (t.to(device) for t in rope_tables(torch.randint(0, 4096, (tokens,), generator=gen), head_dim))
    qw = _randn(gen, head_dim, device=device, dtype=dtype, scale=0.3) + 1
    kw = _randn(gen, head_dim, device=device, dtype=dtype, scale=0.3) + 1
    slots = torch.randperm(blocks * page, generator=gen)[:tokens]
    slots[tokens // 2] = -1  # a padded row
    slots = slots.to(device)
    cache_k = _randn(gen, blocks, page, kv_heads, head_dim, device=device, dtype=dtype).to(cache_dtype)
    cache_v = _randn(gen, blocks, page, kv_heads, head_dim, device=device, dtype=dtype).to(cache_dtype)
    expected_k, expected_v, got_k, got_v = cache_k.clone(), cache_v.clone(), cache_k, cache_v
    qkv_plain = qkv.clone()
    q2, k2, v2 = (t.view(tokens, -1, head_dim) for t in qkv_plain.split(
        [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1))
    qk_norm_rope_(q2, k2, cos, sin, qw, kw, 1e-6)
    store_kvcache(k2, v2, expected_k, expected_v, slots)
    qk_norm_rope_(q, k, cos, sin, qw, kw, 1e-6, store=(v, got_k, got_v, slots))
    what = f"qk_norm_rope_ store T={tokens} {dtype} -> {cache_dtype} seed {seed}"
    assert torch.equal(qkv, qkv_plain), what + ": q/k differ from the unfused call"
    for got, expected in ((got_k, expected_k), (got_v, expected_v)):
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), what + ": cache differs"
