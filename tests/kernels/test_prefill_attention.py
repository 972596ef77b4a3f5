from __future__ import annotations

import random

import pytest
import torch

from kernels.reference import paged_attention_ref
from tests.kernels.gpu import needs_cuda
from tests.kernels.paged_batch import assert_close_per_seq, fresh_seed, make_paged_batch

pytestmark = needs_cuda


def _mixed_batch(block_size: int, seed: int) -> tuple[list[int], list[int]]:
    """(seq_len, q_len) pairs: fresh prompts, prefix hits, chunked-prefill middles, decode rows,
    lengths on and around block edges and around the kernel's 128-row query tile."""
    rng = random.Random(seed)
    bs = block_size
    pairs = [
        (1, 1),  # one-token prompt
        (bs, bs),  # prompt filling exactly one block
        (bs + 1, bs + 1),
        (2 * bs - 1, 2 * bs - 1),  # partly filled last block
        (3 * bs, bs),  # prefix hit of 2 whole blocks, one new block
        (3 * bs + 1, 2),  # prefix ends mid-block
        (2 * bs + 5, 1),  # a decode row inside a prefill batch
        (200, 129),  # query tile boundary
        (700, 300),  # chunked prefill middle chunk
    ]
    pairs += [(s, rng.randint(1, s)) for s in (rng.randint(1, 1200) for _ in range(3))]
    rng.shuffle(pairs)
    return [p[0] for p in pairs], [p[1] for p in pairs]


@pytest.mark.parametrize("gqa", [1, 2, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 256])
def test_prefill_matches_reference(gqa, head_dim, block_size):
    from kernels.prefill_attention import paged_prefill_attention

    seed = fresh_seed()
    seq_lens, q_lens = _mixed_batch(block_size, seed)
    num_kv_heads = 2
    b = make_paged_batch(
        seq_lens, q_lens, num_heads=gqa * num_kv_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim, block_size=block_size, dtype=torch.bfloat16, seed=seed,
    )  # fmt: skip
    scale = head_dim**-0.5
    out = paged_prefill_attention(
        b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables,
        b.max_query_len, scale,
    )  # fmt: skip
    ref = paged_attention_ref(
        b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, scale
    )
    assert not torch.isnan(out).any(), f"NaN in output (seed {seed})"
    assert_close_per_seq(out, ref, b.query_start_loc, seed)


@pytest.mark.parametrize("block_m,block_n,num_warps", [(128, 64, 8), (128, 128, 8), (64, 32, 4)])
def test_prefill_tile_shapes_agree(block_m, block_n, num_warps):
    from kernels.prefill_attention import paged_prefill_attention

    seed = fresh_seed()
    seq_lens, q_lens = _mixed_batch(16, seed)
    b = make_paged_batch(
        seq_lens, q_lens, num_heads=32, num_kv_heads=8, head_dim=128, block_size=16,
        dtype=torch.float16, seed=seed,
    )  # fmt: skip
    out = paged_prefill_attention(
        b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables,
        b.max_query_len, 128**-0.5, block_m=block_m, block_n=block_n, num_warps=num_warps,
    )  # fmt: skip
    ref = paged_attention_ref(
        b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, 128**-0.5
    )
    assert_close_per_seq(out, ref, b.query_start_loc, seed)


def test_prefill_long_prompt_uses_large_tiles_correctly():
    from kernels.prefill_attention import LONG_QUERY, paged_prefill_attention

    seed = fresh_seed()
    seq_lens, q_lens = [LONG_QUERY + 37, 300], [LONG_QUERY + 5, 300]  # long chunk after a prefix
    b = make_paged_batch(
        seq_lens, q_lens, num_heads=8, num_kv_heads=2, head_dim=128, block_size=256,
        dtype=torch.bfloat16, seed=seed,
    )  # fmt: skip
    out = paged_prefill_attention(
        b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables,
        b.max_query_len, 128**-0.5,
    )  # fmt: skip
    ref = paged_attention_ref(
        b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, 128**-0.5
    )
    assert not torch.isnan(out).any(), f"NaN in output (seed {seed})"
    assert_close_per_seq(out, ref, b.query_start_loc, seed)


@pytest.mark.parametrize("gqa", [1, 2, 4])
@pytest.mark.parametrize("long", [False, True])
def test_prefill_with_a_padded_tile_map_matches_reference(gqa, long):
    """The CUDA-graph form (engine.prefill_graphs): the grid is a fixed-length tile map with padding
    entries, the batch has padding sequence rows (no queries) and padding token rows past the last
    query; the tile shape follows the graph's token count, not the batch's longest query."""
    import numpy as np

    from kernels.prefill_attention import LONG_QUERY, paged_prefill_attention
    from kernels.prefill_tiles import max_tiles, query_tiles, tile_shape

    seed = fresh_seed()
    seq_lens, q_lens = _mixed_batch(16, seed)
    pad_seqs, pad_tokens = 3, 40
    b = make_paged_batch(
        seq_lens, q_lens, num_heads=gqa * 2, num_kv_heads=2, head_dim=128, block_size=16,
        dtype=torch.bfloat16, seed=seed,
    )  # fmt: skip
    num_tokens = sum(q_lens)
    graph_tokens = LONG_QUERY if long else num_tokens + pad_tokens
    block_q = tile_shape(gqa, graph_tokens).block_q
    length = max_tiles(graph_tokens, len(q_lens) + pad_seqs, block_q)
    tile_seq, tile_start = query_tiles(np.array(q_lens), np.array(seq_lens), block_q, length)
    tiles = (torch.from_numpy(tile_seq).cuda(), torch.from_numpy(tile_start).cuda())
    q = torch.cat([b.q, torch.randn(pad_tokens, *b.q.shape[1:], device="cuda").to(b.q.dtype)])
    qsl = torch.cat([b.query_start_loc, torch.full((pad_seqs,), num_tokens, dtype=torch.int32, device="cuda")])
    lens = torch.cat([b.seq_lens, torch.zeros(pad_seqs, dtype=torch.int32, device="cuda")])
    tables = torch.cat([b.block_tables, torch.zeros(pad_seqs, b.block_tables.shape[1], dtype=torch.int32,
                                                    device="cuda")])
    out = paged_prefill_attention(q, b.k_cache, b.v_cache, qsl, lens, tables, graph_tokens, 128**-0.5, tiles=tiles)
    ref = paged_attention_ref(b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables, 128**-0.5)
    assert not torch.isnan(out).any(), f"NaN in output (seed {seed})"
    assert_close_per_seq(out[:num_tokens], ref, b.query_start_loc, seed)
    assert (out[num_tokens:] == 0).all()  # padding token rows are never visited

