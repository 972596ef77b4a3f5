"""flash-attn backend (FlashAttention-4 on Hopper, else flash-attn 2) and the phase-routed `auto`
backend against the float32 reference, eagerly and replayed from a CUDA graph; skipped where
flash_attn does not import."""

from __future__ import annotations

import random

import pytest
import torch

from kernels.reference import paged_attention_ref
from tests.kernels.backend_meta import meta_for
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import assert_close_per_seq, fresh_seed, make_paged_batch

pytestmark = needs_cuda


def _backend():
    pytest.importorskip("flash_attn")
    from engine.attention.flash_attn_backend import FlashAttnBackend

    return FlashAttnBackend()


def _finite_unused_slots(b, seed):
    """FA4 reads whole pages and masks the keys past a sequence's end; those rows must be finite
    (P = 0 times NaN is NaN), as in the engine's zeroed cache. Fill the batch's NaN poison with
    large random values instead, so a read of the wrong rows still shows."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for cache in (b.k_cache, b.v_cache):
        noise = (torch.randn(cache.shape, generator=gen, device="cuda") * 100).to(cache.dtype)
        cache.copy_(torch.where(torch.isnan(cache), noise, cache))


def _batch(decode, num_heads, block_size, seed, dtype=torch.bfloat16):
    rng = random.Random(seed)
    seq_lens = [rng.randint(1, 1500) for _ in range(6)] + [block_size, 2 * block_size + 1]
    q_lens = [1] * len(seq_lens) if decode else [rng.randint(1, s) for s in seq_lens]
    b = make_paged_batch(
        seq_lens, q_lens, num_heads=num_heads, num_kv_heads=8, head_dim=128, block_size=block_size,
        dtype=dtype, seed=seed,
    )  # fmt: skip
    _finite_unused_slots(b, seed)
    return b


def _reference(b):
    return paged_attention_ref(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, 128**-0.5)


@pytest.mark.parametrize("decode", [False, True])
@pytest.mark.parametrize("num_heads", [16, 32])
@pytest.mark.parametrize("block_size", [16, 256])
def test_flash_attn_forward_matches_reference(decode, num_heads, block_size):
    backend = _backend()
    if backend.version == 2 and block_size % 256:
        pytest.skip("flash-attn 2 pages only multiples of 256")
    seed = fresh_seed()
    b = _batch(decode, num_heads, block_size, seed)
    out = backend.forward(b.q, b.k, b.v, b.k_cache, b.v_cache, meta_for(b, decode), 128**-0.5)
    assert_close_per_seq(out, _reference(b), b.query_start_loc, seed)


def test_flash_attn_4_refuses_float32():
    backend = _backend()
    if backend.version != 4:
        pytest.skip("FlashAttention-4 only")
    b = make_paged_batch([20], [20], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                         dtype=torch.float32, seed=fresh_seed())
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        backend.forward(b.q, b.k, b.v, b.k_cache, b.v_cache, meta_for(b, False), 0.125)


@pytest.mark.parametrize("num_seqs", [1, 7, 64])
def test_flash_attn_decode_replays_from_a_cuda_graph(num_seqs):
    """Captured once, replayed on new queries and new context lengths written into the same
    buffers: the graph must read them, not the values seen at capture."""
    backend = _backend()
    seed = fresh_seed()
    rng = random.Random(seed)
    b = make_paged_batch([2048] * num_seqs, [1] * num_seqs, num_heads=16, num_kv_heads=8, head_dim=128,
                         block_size=256, dtype=torch.bfloat16, seed=seed)
    _finite_unused_slots(b, seed)
    meta = meta_for(b, True)
    q, k, v = b.q.clone(), b.k.clone(), b.v.clone()
    backend.forward(q, k, v, b.k_cache, b.v_cache, meta, 128**-0.5)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(q, k, v, b.k_cache, b.v_cache, meta, 128**-0.5)
    new_lens = [rng.randint(1, 2048) for _ in range(num_seqs)]
    b.seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
    block = b.block_tables.long()
    pos = torch.tensor(new_lens, device="cuda") - 1
    b.slot_mapping.copy_(block.gather(1, (pos // 256)[:, None])[:, 0] * 256 + pos % 256)
    q.copy_(torch.randn_like(q))
    k.copy_(torch.randn_like(k))
    v.copy_(torch.randn_like(v))
    graph.replay()
    torch.cuda.synchronize()
    ref = paged_attention_ref(q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, 128**-0.5)
    assert_close_per_seq(out, ref, b.query_start_loc, seed)


@pytest.mark.parametrize("decode", [False, True])
def test_phase_routed_backend_matches_reference(decode):
    from engine.attention.phases import PhaseRoutedBackend
    from engine.attention.triton_backend import TritonAttentionBackend

    backend = PhaseRoutedBackend(_backend(), TritonAttentionBackend())
    seed = fresh_seed()
    b = _batch(decode, 32, 256, seed)
    out = backend.forward(b.q, b.k, b.v, b.k_cache, b.v_cache, meta_for(b, decode), 128**-0.5)
    assert_close_per_seq(out, _reference(b), b.query_start_loc, seed)
