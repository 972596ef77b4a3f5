"""The Triton kernels over an fp8 (float8 e4m3) KV cache, against the float32 reference reading the
same fp8 values: the store saturates and rounds as torch's cast does, and decode and prefill
attention convert what they read."""

from __future__ import annotations

import random

import pytest
import torch

from kernels.reference import decode_attention_ref, paged_attention_ref
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import assert_close_per_seq, fresh_seed, make_paged_batch, rel_err

pytestmark = needs_cuda
FP8 = torch.float8_e4m3fn


def _fp8_batch(seq_lens, q_lens, num_heads, num_kv_heads, block_size, seed):
    """A bf16 batch whose caches are cast to fp8 (their NaN poison stays NaN)."""
    b = make_paged_batch(seq_lens, q_lens, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=128,
                         block_size=block_size, dtype=torch.bfloat16, seed=seed)
    return b, b.k_cache.to(FP8), b.v_cache.to(FP8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_store_into_fp8_rounds_and_saturates_like_torch(dtype):
    from engine.attention.torch_backend import to_cache_dtype
    from kernels.store_kvcache import store_kvcache

    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    num_tokens, num_kv_heads, head_dim, block_size = 200, 8, 128, 16
    num_slots = 2 * num_tokens
    k = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen) * 200).to(dtype).cuda()  # past 448 too
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype).cuda()
    shape = (num_slots // block_size, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), device="cuda").to(FP8)
    v_cache = k_cache.clone()
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    slots[::7] = -1
    store_kvcache(k, v, k_cache, v_cache, slots.cuda())
    kept = slots >= 0
    stored_k = k_cache.view(num_slots, num_kv_heads, head_dim).float().cpu()
    stored_v = v_cache.view(num_slots, num_kv_heads, head_dim).float().cpu()
    assert torch.equal(stored_k[slots[kept]], to_cache_dtype(k.cpu()[kept], FP8).float()), f"seed {seed}"
    assert torch.equal(stored_v[slots[kept]], to_cache_dtype(v.cpu()[kept], FP8).float()), f"seed {seed}"
    assert stored_k[slots[kept]].abs().max() == torch.finfo(FP8).max
    untouched = torch.ones(num_slots, dtype=torch.bool)
    untouched[slots[kept]] = False
    assert torch.isnan(stored_k[untouched]).all() and torch.isnan(stored_v[untouched]).all()


@pytest.mark.parametrize("num_heads,num_kv_heads", [(16, 8), (32, 8)])
@pytest.mark.parametrize("block_size", [16, 256])
def test_decode_over_an_fp8_cache_matches_the_float32_reference(num_heads, num_kv_heads, block_size):
    from kernels.decode_attention import paged_decode_attention

    seed = fresh_seed()
    rng = random.Random(seed)
    seq_lens = [1, block_size, block_size + 1] + [rng.randint(1, 3000) for _ in range(20)] + [0]
    b, k_cache, v_cache = _fp8_batch(seq_lens, [min(1, s) for s in seq_lens], num_heads, num_kv_heads,
                                     block_size, seed)
    q = torch.randn(len(seq_lens), num_heads, 128, device="cuda").bfloat16()
    ref = decode_attention_ref(q, k_cache, v_cache, b.block_tables, b.seq_lens, 128**-0.5)
    for splits in (None, 1, 7):
        out = paged_decode_attention(q, k_cache, v_cache, b.block_tables, b.seq_lens, 128**-0.5,
                                     max_seq_len_hint=b.max_seq_len, num_splits=splits)
        assert out.dtype == torch.bfloat16 and not torch.isnan(out).any()
        for i, s in enumerate(seq_lens):
            if s:
                assert rel_err(out[i], ref[i]) < 1e-2, f"seq {i} len {s} splits {splits} (seed {seed})"
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))


@pytest.mark.parametrize("block_size", [16, 256])
def test_prefill_over_an_fp8_cache_matches_the_float32_reference(block_size):
    from kernels.prefill_attention import paged_prefill_attention

    seed = fresh_seed()
    rng = random.Random(seed)
    q_lens = [rng.randint(1, 700) for _ in range(6)] + [5000]  # the long query's large tiles too
    seq_lens = [q + rng.choice([0, 1, block_size, rng.randint(1, 2000)]) for q in q_lens]
    b, k_cache, v_cache = _fp8_batch(seq_lens, q_lens, 16, 8, block_size, seed)
    out = paged_prefill_attention(b.q, k_cache, v_cache, b.query_start_loc, b.seq_lens, b.block_tables,
                                  b.max_query_len, 128**-0.5)
    ref = paged_attention_ref(b.q, k_cache, v_cache, b.query_start_loc, b.seq_lens, b.block_tables, 128**-0.5)
    assert not torch.isnan(out).any(), f"NaN in output (seed {seed})"
    assert_close_per_seq(out, ref, b.query_start_loc, seed)


def test_a_query_dtype_the_kernels_cannot_compute_is_refused_over_an_fp8_cache():
    from kernels.decode_attention import paged_decode_attention

    cache = torch.zeros(2, 16, 2, 64, device="cuda").to(FP8)
    q = torch.randn(1, 4, 64, device="cuda", dtype=torch.float64)
    tables = torch.zeros(1, 1, dtype=torch.int32, device="cuda")
    lens = torch.ones(1, dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="q.dtype"):
        paged_decode_attention(q, cache, cache.clone(), tables, lens, 0.125)
