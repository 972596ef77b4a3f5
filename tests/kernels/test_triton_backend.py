from __future__ import annotations

import random

import pytest
import torch

from engine.attention.metadata import AttentionMetadata
from kernels.reference import paged_attention_ref
from tests.kernels.backend_meta import meta_for
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import assert_close_per_seq, fresh_seed, make_paged_batch

pytestmark = needs_cuda


@pytest.mark.parametrize("decode", [False, True])
@pytest.mark.parametrize("block_size", [16, 256])
def test_forward_stores_then_attends(decode, block_size):
    from engine.attention.triton_backend import TritonAttentionBackend

    seed = fresh_seed()
    rng = random.Random(seed)
    seq_lens = [rng.randint(1, 900) for _ in range(6)] + [block_size, 2 * block_size + 1]
    q_lens = [1] * len(seq_lens) if decode else [rng.randint(1, s) for s in seq_lens]
    # new tokens' slots stay poisoned (NaN) until the backend stores them
    b = make_paged_batch(
        seq_lens, q_lens, num_heads=16, num_kv_heads=8, head_dim=128, block_size=block_size,
        dtype=torch.bfloat16, seed=seed, store_new=False,
    )  # fmt: skip
    backend = TritonAttentionBackend()
    out = backend.forward(b.q, b.k, b.v, b.k_cache, b.v_cache, meta_for(b, decode), 128**-0.5)
    flat_k = b.k_cache.view(-1, 8, 128)
    assert torch.equal(flat_k[b.slot_mapping], b.k), f"new keys not stored (seed {seed})"
    ref = paged_attention_ref(
        b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, 128**-0.5
    )
    assert not torch.isnan(out).any(), f"NaN (seed {seed})"
    assert_close_per_seq(out, ref, b.query_start_loc, seed)


def test_decode_is_cuda_graph_capturable_and_replays_new_inputs():
    from engine.attention.triton_backend import TritonAttentionBackend

    num_seqs, num_heads, num_kv_heads, head_dim, block_size = 8, 32, 8, 128, 16
    max_blocks, num_blocks = 64, 600  # room for contexts up to 1024 tokens per sequence
    backend = TritonAttentionBackend()
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.empty_like(k_cache)
    static = dict(
        q=torch.empty(num_seqs, num_heads, head_dim, dtype=torch.bfloat16, device="cuda"),
        k=torch.empty(num_seqs, num_kv_heads, head_dim, dtype=torch.bfloat16, device="cuda"),
        v=torch.empty(num_seqs, num_kv_heads, head_dim, dtype=torch.bfloat16, device="cuda"),
        slot_mapping=torch.empty(num_seqs, dtype=torch.int64, device="cuda"),
        query_start_loc=torch.arange(num_seqs + 1, dtype=torch.int32, device="cuda"),
        seq_lens=torch.empty(num_seqs, dtype=torch.int32, device="cuda"),
        block_tables=torch.zeros(num_seqs, max_blocks, dtype=torch.int32, device="cuda"),
    )

    def load(seed: int, real: int):
        """Copy a fresh random decode batch of `real` sequences into the static buffers; the rest
        are padding rows (slot -1, seq_len 0), as the runner pads a graph batch."""
        rng = random.Random(seed)
        lens = [rng.randint(1, max_blocks * block_size) for _ in range(real)]
        b = make_paged_batch(
            lens, [1] * real, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            block_size=block_size, dtype=torch.bfloat16, seed=seed, store_new=False,
            spare_blocks=num_blocks - sum(-(-s // block_size) for s in lens),
        )  # fmt: skip
        k_cache.copy_(b.k_cache)
        v_cache.copy_(b.v_cache)
        for name in ("q", "k", "v", "seq_lens"):
            static[name].zero_()
            static[name][:real] = getattr(b, name)
        static["slot_mapping"].fill_(-1)
        static["slot_mapping"][:real] = b.slot_mapping
        static["block_tables"].zero_()
        static["block_tables"][:real, : b.block_tables.shape[1]] = b.block_tables
        return b

    meta = AttentionMetadata(
        slot_mapping=static["slot_mapping"],
        query_start_loc=static["query_start_loc"],
        seq_lens=static["seq_lens"],
        block_tables=static["block_tables"],
        max_query_len=1,
        max_seq_len=max_blocks * block_size,  # the longest context the graph will replay
        is_decode_only=True,
    )
    scale = head_dim**-0.5
    seed = fresh_seed()
    load(seed, num_seqs)
    for _ in range(2):  # compile and warm up outside the capture
        backend.forward(static["q"], static["k"], static["v"], k_cache, v_cache, meta, scale)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(static["q"], static["k"], static["v"], k_cache, v_cache, meta, scale)

    for i, real in enumerate((num_seqs, 5, 1)):
        b = load(seed + 1 + i, real)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = paged_attention_ref(
            b.q, k_cache, v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale
        )
        assert_close_per_seq(out[:real], ref, b.query_start_loc, seed)
        assert torch.equal(out[real:], torch.zeros_like(out[real:])), "padded rows must be zero"
