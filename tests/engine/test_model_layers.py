"""Tensor-parallel layers: the shards of every rank, combined, compute the unsharded layer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from engine.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from engine.layers.norm import RMSNorm
from engine.layers.parallel import TensorParallel
from engine.layers.rotary import RotaryEmbedding, apply_rotary

_never = lambda x: pytest.fail("collective called")  # noqa: E731


def _ranks(size: int) -> list[TensorParallel]:
    return [TensorParallel(r, size, _never, _never) if size > 1 else TensorParallel() for r in range(size)]


@pytest.mark.parametrize("size", [1, 2, 4])
def test_column_and_merged_shards_concatenate_to_full_output(size):
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    gate, up, bias_g, bias_u = torch.randn(16, 8), torch.randn(16, 8), torch.randn(16), torch.randn(16)
    parts_g, parts_u, parts_c = [], [], []
    for tp in _ranks(size):
        merged = MergedColumnParallelLinear(8, [16, 16], bias=True, tp=tp)
        for shard_id, (w, b) in enumerate([(gate, bias_g), (up, bias_u)]):
            merged.weight.weight_loader(merged.weight, w, shard_id)
            merged.bias.weight_loader(merged.bias, b, shard_id)
        g, u = merged(x).chunk(2, dim=-1)
        parts_g.append(g)
        parts_u.append(u)
        col = ColumnParallelLinear(8, 16, tp=tp)
        col.weight.weight_loader(col.weight, gate)
        parts_c.append(col(x))
    torch.testing.assert_close(torch.cat(parts_g, -1), F.linear(x, gate, bias_g))
    torch.testing.assert_close(torch.cat(parts_u, -1), F.linear(x, up, bias_u))
    torch.testing.assert_close(torch.cat(parts_c, -1), F.linear(x, gate))


@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_qkv_shards_hold_their_heads_and_replicate_kv_when_needed(size):
    torch.manual_seed(0)
    heads, kv_heads, d = 8, 2, 4
    wq, wk, wv = torch.randn(heads * d, 16), torch.randn(kv_heads * d, 16), torch.randn(kv_heads * d, 16)
    for tp in _ranks(size):
        layer = QKVParallelLinear(16, d, heads, kv_heads, bias=False, tp=tp)
        for sid, w in zip("qkv", (wq, wk, wv)):
            layer.weight.weight_loader(layer.weight, w, sid)
        h, kvh = heads // size, max(1, kv_heads // size)
        assert (layer.num_heads, layer.num_kv_heads) == (h, kvh)
        q, k, v = layer.weight.split([h * d, kvh * d, kvh * d])
        torch.testing.assert_close(q, wq[tp.rank * h * d : (tp.rank + 1) * h * d])
        # the kv head a rank holds is the one its query heads attend to (GQA group)
        first_kv = (tp.rank * h) // (heads // kv_heads)
        torch.testing.assert_close(k, wk[first_kv * d : (first_kv + kvh) * d])
        torch.testing.assert_close(v, wv[first_kv * d : (first_kv + kvh) * d])


@pytest.mark.parametrize("size", [2, 4])
def test_row_parallel_partial_sums_add_up_with_bias_once(size):
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 16), torch.randn(8, 16), torch.randn(8)
    partial = []
    for tp in _ranks(size):
        layer = RowParallelLinear(16, 8, bias=True, tp=TensorParallel(tp.rank, size, lambda t: t, lambda t: t))
        layer.weight.weight_loader(layer.weight, w)
        layer.bias.weight_loader(layer.bias, b)
        partial.append(layer(x.narrow(1, tp.rank * 16 // size, 16 // size)))
    torch.testing.assert_close(sum(partial), F.linear(x, w, b))


@pytest.mark.parametrize("size", [1, 3, 4])
def test_vocab_parallel_embedding_and_head_with_uneven_vocab(size):
    torch.manual_seed(0)
    vocab, dim = 10, 6
    table = torch.randn(vocab, dim)
    ids = torch.tensor([0, 9, 3, 7, 5])
    hidden = torch.randn(4, dim)
    embeds, logits = [], []
    for tp in _ranks(size):
        emb = VocabParallelEmbedding(vocab, dim, TensorParallel(tp.rank, size, lambda t: t, lambda t: t))
        emb.weight.weight_loader(emb.weight, table)
        embeds.append(emb(ids))
        head = ParallelLMHead(vocab, dim, TensorParallel(tp.rank, size, lambda t: t, lambda t: t))
        head.weight.weight_loader(head.weight, table)
        logits.append(F.linear(hidden, head.weight))
    torch.testing.assert_close(sum(embeds), F.embedding(ids, table))
    torch.testing.assert_close(torch.cat(logits, -1)[:, :vocab], hidden @ table.T)
    # padding rows past the vocabulary are zero, so they can never win an argmax by accident
    assert torch.count_nonzero(torch.cat(logits, -1)[:, vocab:]) == 0


def test_tensor_parallel_validates_its_fields():
    with pytest.raises(ValueError, match="tp_rank=2"):
        TensorParallel(2, 2, _never, _never)
    with pytest.raises(ValueError, match="tp_size=0"):
        TensorParallel(0, 0)
    with pytest.raises(ValueError, match="all_reduce and all_gather"):
        TensorParallel(0, 2)
    with pytest.raises(ValueError, match="output_size=10 must be divisible by tp_size=4"):
        ColumnParallelLinear(8, 10, tp=TensorParallel(0, 4, _never, _never))


def test_weight_loader_rejects_wrong_shapes():
    layer = MergedColumnParallelLinear(8, [16, 16])
    with pytest.raises(ValueError, match=r"checkpoint has \(16, 7\), model expects \(16, 8\)"):
        layer.weight.weight_loader(layer.weight, torch.zeros(16, 7), 0)


def test_rmsnorm_fused_residual_equals_add_then_norm():
    torch.manual_seed(0)
    norm = RMSNorm(8, eps=1e-6)
    norm.weight.data = torch.randn(8)
    x, r = torch.randn(3, 8), torch.randn(3, 8)
    out, new_residual = norm(x, r)
    s = x + r
    torch.testing.assert_close(new_residual, s)
    torch.testing.assert_close(out, norm.weight * s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_rotary_preserves_norm_and_relative_positions():
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=8, max_position=64, theta=10000.0)
    q, k = torch.randn(1, 2, 8), torch.randn(1, 2, 8)

    def score(pq: int, pk: int) -> torch.Tensor:
        cq, sq = rope(torch.tensor([pq]))
        ck, sk = rope(torch.tensor([pk]))
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum(-1)

    cos, sin = rope(torch.tensor([5]))
    torch.testing.assert_close(apply_rotary(q, cos, sin).norm(dim=-1), q.norm(dim=-1))
    # attention scores depend only on the distance between positions
    torch.testing.assert_close(score(7, 3), score(40, 36))
    assert not torch.allclose(score(7, 3), score(7, 4))
