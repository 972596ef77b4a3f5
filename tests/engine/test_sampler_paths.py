"""The sampler's mechanisms on CPU: the counter-based noise (keys, hash, distribution), the
per-composition cache, and the top-k/top-p cutoffs (topk and sort groups agree; a row's cutoff
does not depend on its batch). Under TRITON_INTERPRET=1 the kernel path runs the same
properties (tests/kernels/interpret_fused.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine.sampler_filters as filters
from engine.core.sampling_params import SamplingParams
from engine.sampler import Sampler
from engine.sampler_noise import MASK32, hash32, hash_bits, key_words, keys_for, log_exponential, seed_for
from tests.engine import sampler_checks as checks


def test_vectorised_keys_equal_the_scalar_definition():
    rng = np.random.default_rng(0)
    seeds = np.concatenate([[0, 1, 2**63 - 1], rng.integers(0, 2**63, 200, dtype=np.int64)]).astype(np.uint64)
    indices = np.concatenate([[0, 5, 10**9], rng.integers(0, 2**31, 200)])
    keys = keys_for(seeds, indices)
    assert [int(k) for k in keys] == [seed_for(int(s), int(i)) for s, i in zip(seeds, indices)]


def test_tensor_hash_equals_the_scalar_hash_bit_for_bit():
    # keys with high bits set make every multiply wrap; int32 arithmetic must wrap like uint32
    keys = np.array([0, MASK32, 2**64 - 1, 0x8000000080000000, 0x123456789ABCDEF0], dtype=np.uint64)
    bits = hash_bits(torch.from_numpy(key_words(keys)), 70_000)
    for row, key in enumerate(keys.tolist()):
        for v in (0, 1, 2, 31, 65_535, 65_536, 69_999):
            assert int(bits[row, v]) & MASK32 == hash32(v, key), (key, v)


def test_noise_is_exponential_and_rows_are_unrelated():
    keys = keys_for(np.full(64, 42, dtype=np.uint64), np.arange(64))  # one request, 64 steps
    e = log_exponential(torch.from_numpy(key_words(keys)), 20_000).exp().double()  # [64, 20000]
    assert abs(e.mean().item() - 1.0) < 0.01 and abs(e.var().item() - 1.0) < 0.03
    # CDF of Exp(1) at a few points, over 1.28M draws (std of each fraction < 5e-4)
    for x in (0.1, 0.5, 1.0, 2.0, 4.0):
        assert abs((e < x).double().mean().item() - (1 - np.exp(-x))) < 3e-3, x
    centred = (e - e.mean(dim=1, keepdim=True)).float()
    corr = torch.corrcoef(centred)  # [64, 64]: consecutive steps must look independent
    off_diagonal = corr[~torch.eye(64, dtype=torch.bool)]
    assert off_diagonal.abs().max().item() < 0.04  # ~5.6 sd at n = 20000


def test_the_composition_is_built_once_and_rebuilt_on_change():
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.8, seed=i, top_k=20) for i in range(4)]
    sampler = Sampler(seed=3)
    first = sampler.sample(logits, params, [0] * 4)
    built = sampler._rows
    sampler.sample(logits, list(params), [1] * 4)
    assert sampler._rows is built  # same request objects: nothing rebuilt
    sampler.sample(logits, [SamplingParams(temperature=0.8, seed=i, top_k=20) for i in range(4)], [0] * 4)
    assert sampler._rows is built  # equal params: still reusable
    greedy = [SamplingParams(temperature=0.0)] * 4
    assert torch.equal(sampler.sample(logits, greedy, [0] * 4), logits.argmax(dim=-1))
    again = sampler.sample(logits, params, [0] * 4)
    assert torch.equal(again, first)  # seeded rows: same draw after the rebuild


def _cutoff_alone(row: torch.Tensor, p: SamplingParams) -> float:
    groups = Sampler()._composition([p], row.shape[0]).groups
    return filters.cutoffs(row[None], groups)[0].item() if groups else float("-inf")


def test_a_rows_cutoff_does_not_depend_on_its_batch():
    vocab = 3000
    logits = torch.randn(7, vocab, generator=torch.Generator().manual_seed(1)) * 2
    params = [SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.2, top_p=0.6),
              SamplingParams(temperature=0.0, top_k=3), SamplingParams(temperature=0.9),
              SamplingParams(temperature=0.5, top_k=2000, top_p=0.95),
              SamplingParams(temperature=2.0, top_k=40, top_p=0.3),
              SamplingParams(temperature=1.0, top_k=1500)]
    rows = Sampler()._composition(params, vocab)
    assert sorted(g.width for g in rows.groups) == [40, vocab]  # topk over the small ks, sort for the rest
    batch = filters.cutoffs(logits, rows.groups)
    assert torch.isinf(batch[[2, 3]]).all()  # greedy, unfiltered
    for i, p in enumerate(params):
        assert batch[i].item() == _cutoff_alone(logits[i], p), i


@pytest.mark.parametrize("seed", range(5))
def test_topk_and_sort_groups_give_the_same_cutoffs(seed, monkeypatch):
    gen = torch.Generator().manual_seed(seed)
    vocab = 2000
    logits = torch.randn(16, vocab, generator=gen) * float(torch.rand(1, generator=gen) * 5 + 0.1)
    if seed % 2:
        logits = logits.round()  # ties at the cutoff
    params = [SamplingParams(temperature=0.3 + i / 8, top_k=int(k), top_p=(1.0, 0.5, 0.9, 0.99)[i % 4])
              for i, k in enumerate(torch.randint(1, 300, (16,), generator=gen))]
    by_topk = filters.cutoffs(logits, Sampler()._composition(params, vocab).groups)
    monkeypatch.setattr(filters, "TOPK_LIMIT", 0)
    sorted_groups = Sampler()._composition(params, vocab).groups
    assert [g.width for g in sorted_groups] == [vocab]
    assert torch.equal(filters.cutoffs(logits, sorted_groups), by_topk)


def _generator_path(seed: int) -> Sampler:
    """The torch path as it runs on CUDA: unseeded rows drawn from torch's generator, the hash
    written over the seeded rows only."""
    sampler = Sampler(seed)
    sampler.hash_every_row = False
    return sampler


@pytest.mark.parametrize("check", checks.PATH_CHECKS,
                         ids=lambda c: c.__name__)
def test_generator_noise_path(check):
    check(_generator_path, "cpu")


def test_generator_path_draws_seeded_rows_like_the_hash_path():
    checks.check_seeded_rows_match(_generator_path, Sampler, "cpu")
