"""The float32 reference itself, checked on the CPU against torch's SDPA in float64.

The SDPA side works on dense per-sequence K/V that never went through the paged cache, so the
reference's block-table gather, GQA head mapping and bottom-right causal offset are all checked.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.reference import decode_attention_ref, paged_attention_ref, store_kvcache_ref
from tests.kernels.paged_batch import fresh_seed


def _paged_case(seq_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size, seed):
    gen = torch.Generator().manual_seed(seed)
    dense_k = [torch.randn(s, num_kv_heads, head_dim, generator=gen, dtype=torch.float64) for s in seq_lens]
    dense_v = [torch.randn(s, num_kv_heads, head_dim, generator=gen, dtype=torch.float64) for s in seq_lens]
    nblk = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(nblk) + 2
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen, dtype=torch.float64)
    v_cache = torch.randn_like(k_cache)
    tables = torch.zeros(len(seq_lens), max(nblk), dtype=torch.int32)
    for i, s in enumerate(seq_lens):
        for b in range(nblk[i]):
            tables[i, b] = perm.pop()
        for p in range(s):  # written slot by slot with the documented slot formula
            blk, off = int(tables[i, p // block_size]), p % block_size
            k_cache[blk, off], v_cache[blk, off] = dense_k[i][p], dense_v[i][p]
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen, dtype=torch.float64)
    qsl = torch.tensor([0, *torch.cumsum(torch.tensor(q_lens), 0).tolist()], dtype=torch.int32)
    return q, dense_k, dense_v, k_cache, v_cache, qsl, torch.tensor(seq_lens, dtype=torch.int32), tables


def _sdpa(q, dense_k, dense_v, qsl, seq_lens, num_heads, scale):
    outs = []
    for i, s in enumerate(seq_lens.tolist()):
        qs = q[qsl[i] : qsl[i + 1]].transpose(0, 1)[None]  # [1, num_heads, q_len, head_dim]
        q_len = qs.shape[2]
        group = num_heads // dense_k[i].shape[1]
        k = dense_k[i].repeat_interleave(group, 1).transpose(0, 1)[None]  # [1, num_heads, s, head_dim]
        v = dense_v[i].repeat_interleave(group, 1).transpose(0, 1)[None]
        # query j may see keys 0..(s - q_len + j): a lower-right aligned causal band
        mask = torch.ones(q_len, s, dtype=torch.bool).tril(diagonal=s - q_len)
        outs.append(F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale)[0].transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 2), (8, 2), (8, 1)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_paged_reference_matches_sdpa_float64(num_heads, num_kv_heads, block_size):
    seed = fresh_seed()
    seq_lens = [1, block_size, block_size + 1, 3 * block_size - 1, 37]
    q_lens = [1, block_size, 1, 5, 37]  # decode, full prompt, decode, chunk after a prefix, prompt
    head_dim = 16
    q, dk, dv, kc, vc, qsl, sl, bt = _paged_case(
        seq_lens, q_lens, num_heads, num_kv_heads, head_dim, block_size, seed
    )
    scale = head_dim**-0.5
    out = paged_attention_ref(q, kc, vc, qsl, sl, bt, scale, dtype=torch.float64)
    ref = _sdpa(q, dk, dv, qsl, sl, num_heads, scale)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10, msg=f"seed {seed}")


def test_decode_reference_zero_length_rows_and_float32():
    seed = fresh_seed()
    seq_lens = [5, 0, 9]
    q_full, dk, dv, kc, vc, _, _, bt = _paged_case([5, 1, 9], [1, 1, 1], 4, 2, 16, 4, seed)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    out = decode_attention_ref(q_full, kc, vc, bt, sl, 0.25)
    assert out.dtype == torch.float32
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # padded row (seq_len 0) gives zeros
    ref = _sdpa(q_full[[0, 2]], [dk[0], dk[2]], [dv[0], dv[2]], torch.tensor([0, 1, 2]),
                torch.tensor([5, 9]), 4, 0.25)  # fmt: skip
    torch.testing.assert_close(out[[0, 2]].double(), ref, rtol=1e-5, atol=1e-5, msg=f"seed {seed}")


def test_store_reference_skips_padding_slots():
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    k_cache = torch.full((3, 4, 2, 8), float("nan"))
    v_cache = torch.full((3, 4, 2, 8), float("nan"))
    k = torch.randn(4, 2, 8, generator=gen)
    v = torch.randn(4, 2, 8, generator=gen)
    slots = torch.tensor([5, -1, 11, 0])
    store_kvcache_ref(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(12, 2, 8), v_cache.view(12, 2, 8)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat_k[s], k[i]) and torch.equal(flat_v[s], v[i])
    untouched = [s for s in range(12) if s not in (5, 11, 0)]
    assert torch.isnan(flat_k[untouched]).all() and torch.isnan(flat_v[untouched]).all()
