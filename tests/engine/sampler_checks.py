"""Sampler properties as plain functions of a sampler factory, so that every sampling path is held
to the same checks: the torch path on CUDA and the Triton kernel path (tests/engine/
test_sampler_gpu.py), and the kernel path on CPU under TRITON_INTERPRET=1 (tests/kernels/
interpret_fused.py), and the CPU paths (test_sampler.py, test_sampler_paths.py).

make(seed) returns a Sampler; logits are built on `device`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.core.sampling_params import SamplingParams
from engine.sampler import Sampler

MakeSampler = Callable[[int], Sampler]


def _logits(rows: int, vocab: int, seed: int, scale: float, device: str) -> torch.Tensor:
    return (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale).to(device)


def check_greedy_beside_random(make: MakeSampler, device: str) -> None:
    logits = _logits(6, 1000, 0, 3.0, device)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=3)] * 3
    tokens = make(1).sample(logits, params, [0] * 6)
    assert torch.equal(tokens[0::2], logits.argmax(dim=-1)[0::2])


def check_seeded_independent_of_batch(make: MakeSampler, device: str, draws: int = 40) -> None:
    target = _logits(1, 1000, 5, 0.1, device)[0]  # flat: the draw depends on the noise
    mine = SamplingParams(temperature=1.0, top_k=50, seed=1234)
    others = [SamplingParams(temperature=0.7, top_p=0.5), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.3, seed=99), SamplingParams(temperature=1.0)]
    seen = []
    for index in range(draws):
        alone = make(0).sample(target[None], [mine], [index]).item()
        batch = torch.cat([_logits(2, 1000, index, 1.0, device), target[None],
                           _logits(2, 1000, index + 100, 1.0, device)])
        in_batch = make(77).sample(batch, others[:2] + [mine] + others[2:], [3, 0, index, 8, 1])[2].item()
        assert alone == in_batch, f"draw {index}: {alone} alone, {in_batch} in a batch"
        seen.append(alone)
    assert len(set(seen)) > draws // 4  # the index keys the draw


def check_unseeded_follow_engine_seed(make: MakeSampler, device: str) -> None:
    logits = _logits(8, 1000, 0, 0.1, device)
    params = [SamplingParams(temperature=1.0)] * 8
    first, again, other = (make(s).sample(logits, params, [0] * 8) for s in (5, 5, 6))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def check_temperature_frequencies(make: MakeSampler, device: str, n: int = 4000) -> None:
    # logits [3, 0 x 9]: P(token 4) = e^(3/T) / (e^(3/T) + 9), checked to 4.5 standard deviations
    # (0.031 at n = 4000 for the middle case), both for unseeded and for seeded rows
    row = torch.zeros(10, device=device)
    row[4] = 3.0
    for temperature, expected in ((0.05, 1.0), (1.0, 0.690), (10.0, 0.130)):
        tolerance = max(4.5 * (0.69 * 0.31 / n) ** 0.5, 1e-3)
        params = [SamplingParams(temperature=temperature)] * n
        tokens = make(11).sample(row.expand(n, 10), params, [0] * n)
        assert abs((tokens == 4).float().mean().item() - expected) < tolerance, temperature
        seeded = [SamplingParams(temperature=temperature, seed=i) for i in range(n)]
        tokens = make(11).sample(row.expand(n, 10), seeded, [7] * n)
        assert abs((tokens == 4).float().mean().item() - expected) < tolerance, (temperature, "seeded")


def allowed_tokens(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> set[int]:
    """What top-k then top-p may keep, in float64; ties resolved permissively."""
    scaled = logits.astype(np.float64) / temperature
    k = len(scaled) if top_k == -1 else min(top_k, len(scaled))
    kept = np.flatnonzero(scaled >= np.sort(scaled)[::-1][k - 1])
    probs = np.exp(scaled[kept] - scaled[kept].max())
    probs /= probs.sum()
    return {int(t) for i, t in enumerate(kept) if top_p >= 1.0 or probs[probs > probs[i]].sum() < top_p + 1e-5}


def check_top_k_top_p_allowed(make: MakeSampler, device: str, cases: int = 30, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for case in range(cases):
        vocab = int(rng.integers(2, 60))
        logits = rng.uniform(-20, 20, vocab).astype(np.float32)
        if case % 3 == 0:
            logits = np.round(logits)  # ties
        temperature = float(rng.uniform(0.05, 5.0))
        top_k = -1 if case % 4 == 0 else int(rng.integers(1, 45))
        top_p = 1.0 if case % 5 == 0 else float(rng.uniform(0.01, 1.0))
        n = 64
        params = [SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=None if i % 2 else i)
                  for i in range(n)]
        row = torch.from_numpy(logits).to(device)
        tokens = make(case).sample(row.expand(n, -1).contiguous(), params, list(range(n)))
        allowed = allowed_tokens(logits, temperature, top_k, top_p)
        assert set(tokens.tolist()) <= allowed, f"case {case}: k={top_k} p={top_p} T={temperature}"


def check_top_k_keeps_the_k_best(make: MakeSampler, device: str, n: int = 2000) -> None:
    logits = _logits(1, 1000, 3, 0.01, device)[0]  # nearly flat: without the filter, any token
    best = set(logits.topk(5).indices.tolist())
    tokens = make(2).sample(logits.expand(n, -1), [SamplingParams(top_k=5)] * n, [0] * n)
    assert set(tokens.tolist()) == best


def check_seeded_rows_match(make_a: MakeSampler, make_b: MakeSampler, device: str) -> None:
    """Two paths draw the same tokens for seeded rows (the hash is one definition); near-ties
    may resolve differently in the last float bit, so 99% must agree."""
    n = 256
    logits = _logits(n, 5000, 9, 2.0, device)
    params = [SamplingParams(temperature=0.5 + (i % 5) / 4, top_k=(-1, 40)[i % 2], top_p=(1.0, 0.9)[i % 3 == 0], seed=i)
              for i in range(n)]
    a = make_a(0).sample(logits, params, list(range(n)))
    b = make_b(1).sample(logits, params, list(range(n)))
    assert (a == b).float().mean().item() >= 0.99


# Every sampler path (CPU hash noise, CPU generator noise, GPU kernel) is held to all of these.
PATH_CHECKS = [check_greedy_beside_random, check_seeded_independent_of_batch, check_unseeded_follow_engine_seed,
               check_temperature_frequencies, check_top_k_top_p_allowed, check_top_k_keeps_the_k_best]
