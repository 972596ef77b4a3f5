"""Sampling from vocabulary slices (engine.sharded_sampling) against the single-GPU sampler.

The ranks run one after another in this process, their exchange replayed from a first pass, so
the draw of every rank can be compared with Sampler.sample over the whole vocabulary: the same keys (seeded
rows, and the engine's own stream for the others), the same token in every row, ties included.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.sampling_params import SamplingParams, samples_by_shard
from engine.sampler import Sampler
from engine.sharded_sampling import ShardedSampler


class _Recorded(Exception):
    """Stops a rank at its exchange once its part is recorded."""


def _exchange(parts: list, rank: int, replay: bool):
    """all_gather for ranks run one after another: the first pass records each rank's part and
    stops there; the second returns every recorded part, concatenated in rank order along the
    last dim (the ranks' inputs are the same in both passes). No threads: Triton's interpreter
    is not thread-safe."""
    def all_gather(x: torch.Tensor) -> torch.Tensor:
        if replay:
            return torch.cat(parts, dim=-1)
        parts[rank] = x.clone()
        raise _Recorded
    return all_gather


def _lm_head(weight: torch.Tensor, rank: int, world: int):
    """A stand-in for ParallelLMHead's slice (rows per rank, the last rank's tail padding)."""
    vocab = weight.shape[0]
    rows = -(-vocab // world)
    first = rank * rows
    real = max(0, min(rows, vocab - first))
    return SimpleNamespace(first=first, rows=rows, num_embeddings=vocab,
                           shard_logits=lambda h: h @ weight[first:first + real].T)


def sample_sharded(hidden, weight, draw, world: int, kernel: bool = False) -> list[torch.Tensor]:
    """Each of world ranks' ids; kernel: kernels.sampling (under TRITON_INTERPRET=1 on the CPU),
    else the torch reference."""
    parts: list = [None] * world

    def sampler(rank: int, replay: bool) -> ShardedSampler:
        return ShardedSampler(_lm_head(weight, rank, world), _exchange(parts, rank, replay), hidden.device,
                              kernel=kernel)

    for rank in range(world):
        with pytest.raises(_Recorded):
            sampler(rank, replay=False).sample(hidden, draw)
    return [sampler(rank, replay=True).sample(hidden, draw) for rank in range(world)]


@settings(max_examples=25, deadline=None)
@given(world=st.integers(2, 4), vocab=st.integers(5, 300), rows=st.integers(1, 9), seed=st.integers(0, 2**31),
       data=st.data())
def test_slices_draw_the_single_gpu_token(world, vocab, rows, seed, data):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, 16, generator=gen)
    # weights in multiples of 1/4 and hidden rounded: many exact ties among the logits
    weight = torch.randint(-2, 3, (vocab, 16), generator=gen).float() / 4
    hidden = hidden.round()
    temps = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.7]), min_size=rows, max_size=rows))
    seeds = data.draw(st.lists(st.one_of(st.none(), st.integers(0, 2**40)), min_size=rows, max_size=rows))
    params = [SamplingParams(temperature=t, seed=s) for t, s in zip(temps, seeds)]
    indices = data.draw(st.lists(st.integers(0, 50), min_size=rows, max_size=rows))

    single, driver = Sampler(seed=seed % 1000), Sampler(seed=seed % 1000)
    want = single.sample(hidden @ weight.T, params, indices)
    draw = driver.shard_draw(params, indices, vocab)
    assert draw is not None
    for got in sample_sharded(hidden, weight, draw, world):
        assert torch.equal(got, want)


def test_the_draws_follow_the_engine_stream_step_after_step():
    # unseeded rows take keys from the sampler's stream: the driver's draws must consume it as
    # sample() does, or a TP run would drift from a TP=1 run after its first step
    gen = torch.Generator().manual_seed(0)
    weight, params = torch.randn(50, 8, generator=gen), [SamplingParams(temperature=1.0)] * 3
    single, driver = Sampler(seed=5), Sampler(seed=5)
    for step in range(4):
        hidden = torch.randn(3, 8, generator=gen)
        want = single.sample(hidden @ weight.T, params, [step] * 3)
        draw = driver.shard_draw(params, [step] * 3, 50)
        assert all(torch.equal(got, want) for got in sample_sharded(hidden, weight, draw, 2))


def test_top_k_or_top_p_keeps_the_gather():
    sampler = Sampler()
    plain = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.0, top_k=5)]  # greedy: no filter
    assert samples_by_shard(plain) and sampler.shard_draw(plain, [0, 0], 100) is not None
    for filtered in (SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=0.7, top_p=0.9)):
        assert filtered.needs_whole_vocab and not samples_by_shard(plain + [filtered])
        assert sampler.shard_draw(plain + [filtered], [0, 0, 0], 100) is None


def test_all_greedy_rows_draw_nothing_from_the_stream():
    sampler, fresh = Sampler(seed=3), Sampler(seed=3)
    draw = sampler.shard_draw([SamplingParams(temperature=0.0)] * 2, [0, 0], 10)
    assert not draw.inv_temp.any() and not draw.key_words.any()
    assert sampler.rng.integers(0, 2**63) == fresh.rng.integers(0, 2**63)


@pytest.mark.parametrize("world", [2, 3])
def test_the_padding_of_the_last_slice_never_wins(world):
    # vocab 7 over 3 ranks: slices of 3, 3 and 1 real rows; a padding row scoring 0 would beat
    # every negative logit if it were scored
    weight = -torch.ones(7, 4)
    hidden = torch.ones(2, 4)
    draw = Sampler().shard_draw([SamplingParams(temperature=0.0)] * 2, [0, 0], 7)
    for got in sample_sharded(hidden, weight, draw, world):
        assert got.tolist() == [0, 0]
    assert np.all(draw.inv_temp == 0)


@pytest.mark.parametrize("world", [2, 3])
def test_lm_head_slices_hold_the_real_vocabulary_rows_only(world):
    # vocab 7: ranks of 4 rows (2 ranks) or 3 rows (3 ranks), the last one partly padding, which
    # shard_logits leaves out; together the slices are the whole vocabulary's logits
    from engine.layers.embedding import ParallelLMHead
    from engine.layers.parallel import TensorParallel

    vocab, dim = 7, 4
    weight = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(1))
    hidden = torch.randn(3, dim, generator=torch.Generator().manual_seed(2))
    slices = []
    for rank in range(world):
        head = ParallelLMHead(vocab, dim, TensorParallel(rank, world, lambda t: t, lambda t: t))
        head.weight_loader(head.weight, weight)
        assert head.real_rows == max(0, min(head.rows, vocab - head.first))
        slices.append(head.shard_logits(hidden))
    assert [s.shape[1] for s in slices][-1] < -(-vocab // world)  # the padded rank is shorter
    torch.testing.assert_close(torch.cat(slices, dim=1), hidden @ weight.T)
