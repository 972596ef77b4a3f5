"""flash-attn backend against the float32 reference; skipped where flash_attn does not import."""

from __future__ import annotations

import random

import pytest
import torch

from kernels.reference import paged_attention_ref
from tests.kernels.backend_meta import meta_for
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import assert_close_per_seq, fresh_seed, make_paged_batch

pytestmark = needs_cuda


@pytest.mark.parametrize("decode", [False, True])
@pytest.mark.parametrize("num_heads", [16, 32])
def test_flash_attn_forward_matches_reference(decode, num_heads):
    pytest.importorskip("flash_attn")
    from engine.attention.flash_attn_backend import FlashAttnBackend

    seed = fresh_seed()
    rng = random.Random(seed)
    seq_lens = [rng.randint(1, 1500) for _ in range(6)] + [256, 513]
    q_lens = [1] * len(seq_lens) if decode else [rng.randint(1, s) for s in seq_lens]
    b = make_paged_batch(
        seq_lens, q_lens, num_heads=num_heads, num_kv_heads=8, head_dim=128, block_size=256,
        dtype=torch.bfloat16, seed=seed, store_new=False,
    )  # fmt: skip
    out = FlashAttnBackend().forward(
        b.q, b.k, b.v, b.k_cache, b.v_cache, meta_for(b, decode), 128**-0.5
    )
    ref = paged_attention_ref(
        b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, 128**-0.5
    )
    assert_close_per_seq(out, ref, b.query_start_loc, seed)


def test_flash_attn_rejects_small_blocks():
    pytest.importorskip("flash_attn")
    from engine.attention.flash_attn_backend import FlashAttnBackend

    b = make_paged_batch(
        [20], [20], num_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
        dtype=torch.bfloat16, seed=fresh_seed(),
    )  # fmt: skip
    with pytest.raises(ValueError, match="block_size"):
        FlashAttnBackend().forward(b.q, b.k, b.v, b.k_cache, b.v_cache, meta_for(b, False), 0.125)
