"""Sampler on its CPU path (hash noise for every row): the shared checks of sampler_checks.py, plus
greedy, temperature, seed mixing and the top-k / top-p support (property-tested)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.sampling_params import SamplingParams
from engine.sampler import Sampler, seed_for
from tests.engine import sampler_checks as checks

VOCAB = 1000


def _logits(rows: int, vocab: int = VOCAB, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=gen) * scale


@pytest.mark.parametrize("check", checks.PATH_CHECKS,
                         ids=lambda c: c.__name__)
def test_hash_noise_path(check):
    check(Sampler, "cpu")


def test_an_all_greedy_batch_is_argmax():
    logits = _logits(6, scale=3.0)
    tokens = Sampler(seed=1).sample(logits, [SamplingParams(temperature=0.0)] * 6, [0] * 6)
    assert torch.equal(tokens, logits.argmax(dim=-1))


def test_seed_mixing_separates_neighbours():
    values = {seed_for(s, i) for s in range(20) for i in range(20)}
    assert len(values) == 400
    assert all(0 <= v < 2**63 for v in values)


@pytest.mark.parametrize("temperature, expected", [(0.05, 1.0), (1.0, 0.690), (10.0, 0.130)])
def test_temperature_reshapes_the_distribution(temperature, expected):
    # Logits [3, 0 x 9]: P(argmax) = e^(3/T) / (e^(3/T) + 9).
    row = torch.zeros(10)
    row[4] = 3.0
    n = 4000
    tokens = Sampler(seed=11).sample(row.expand(n, 10), [SamplingParams(temperature=temperature)] * n, [0] * n)
    frequency = (tokens == 4).float().mean().item()
    assert abs(frequency - expected) < 0.03  # > 4 standard deviations at n = 4000


@settings(max_examples=150, deadline=None)
@given(
    logits=st.lists(st.floats(-20, 20, allow_nan=False), min_size=2, max_size=40),
    temperature=st.floats(0.05, 5.0),
    top_k=st.one_of(st.just(-1), st.integers(1, 45)),
    top_p=st.one_of(st.just(1.0), st.floats(0.01, 1.0)),
    seed=st.integers(0, 2**32),
)
def test_top_k_top_p_never_leave_the_allowed_set(logits, temperature, top_k, top_p, seed):
    row = torch.tensor(logits, dtype=torch.float32)
    allowed = checks.allowed_tokens(row.numpy(), temperature, top_k, top_p)
    n = 64
    params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)] * n
    # Half the rows seeded, so both noise sources are checked.
    params[::2] = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)] * (n // 2)
    tokens = Sampler(seed=seed).sample(row.expand(n, -1).clone(), params, list(range(n)))
    assert set(tokens.tolist()) <= allowed


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = _logits(16, scale=0.5)
    argmax = logits.argmax(dim=-1)
    by_k = Sampler().sample(logits, [SamplingParams(temperature=2.0, top_k=1)] * 16, list(range(16)))
    by_p = Sampler().sample(logits, [SamplingParams(temperature=2.0, top_p=1e-6)] * 16, list(range(16)))
    assert torch.equal(by_k, argmax)
    assert torch.equal(by_p, argmax)


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match="logits rows"):
        Sampler().sample(_logits(2), [SamplingParams()], [0, 0])
