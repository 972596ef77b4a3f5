"""Batched token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Sampling is Gumbel-max: the token is argmax(logits / T - log E) with E ~ Exp(1) per vocabulary
entry, which draws from softmax(logits / T) exactly and needs no softmax or multinomial. Filters
set the logits they remove to -inf. The order follows Hugging Face's logits processors:
temperature, then top-k, then top-p on the renormalised remainder.

NOTE: a request with a seed draws its noise from a generator seeded by (seed, index of the
token being sampled). The draw is therefore a function of the request alone: the same whatever
batch it shares, wherever it sits in it, and after a preemption (the recomputed request samples
its next token with the same index). No per-request state has to be kept or released. Requests
without a seed share the sampler's own stream, seeded once by EngineConfig.seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.core.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1
# Exp(1) draws are clamped away from 0 so that -log(E) stays finite (-inf logits stay -inf).
_TINY = 1e-20


def seed_for(seed: int, index: int) -> int:
    """A well-mixed 63-bit generator seed for draw `index` of a request seeded with `seed`.

    splitmix64 finaliser: nearby (seed, index) pairs give unrelated streams.
    """
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


class Sampler:
    """Draws one token per row of a logits batch."""

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    @torch.inference_mode()
    def sample(
        self,
        logits: torch.Tensor,  # [num_rows, vocab] float32
        params: Sequence[SamplingParams],
        output_indices: Sequence[int],  # per row: how many tokens the request has generated so far
    ) -> torch.Tensor:  # [num_rows] int64
        num_rows = logits.shape[0]
        if num_rows != len(params) or num_rows != len(output_indices):
            raise ValueError(f"Sampler.sample: {num_rows} logits rows, {len(params)} params, "
                             f"{len(output_indices)} output indices")
        greedy_tokens = logits.argmax(dim=-1)
        if all(p.temperature == 0.0 for p in params):
            return greedy_tokens
        device = logits.device
        # Greedy rows go through the random path with T = 1 and are overwritten at the end.
        temperature = torch.tensor([p.temperature or 1.0 for p in params], dtype=torch.float32, device=device)
        scores = logits.float() / temperature[:, None]  # [num_rows, vocab]
        top_k = [p.top_k for p in params]
        top_p = [p.top_p for p in params]
        if any(p < 1.0 for p in top_p):
            scores = _top_k_top_p(scores, top_k, top_p)
        elif any(k != -1 for k in top_k):
            scores = _top_k(scores, top_k)
        noise = self._exponential_noise(scores.shape, params, output_indices, device)
        sampled = (scores - noise.log_()).argmax(dim=-1)
        greedy_rows = torch.tensor([p.temperature == 0.0 for p in params], device=device)
        return torch.where(greedy_rows, greedy_tokens, sampled)

    def _exponential_noise(self, shape, params, output_indices, device) -> torch.Tensor:
        noise = torch.empty(shape, dtype=torch.float32, device=device)  # [num_rows, vocab]
        noise.exponential_(generator=self.generator)
        for row, p in enumerate(params):
            if p.seed is not None and p.temperature != 0.0:
                # NOTE: only seeded rows pay for a generator of their own (a few microseconds each).
                gen = torch.Generator(device=device)
                gen.manual_seed(seed_for(p.seed, output_indices[row]))
                noise[row].exponential_(generator=gen)
        return noise.clamp_min_(_TINY)


def _top_k(scores: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """Keep each row's k highest scores (ties with the k-th are kept too); -1 keeps all."""
    vocab = scores.shape[-1]
    ks = torch.tensor([vocab if k == -1 else min(k, vocab) for k in top_k], device=scores.device)
    kth = scores.topk(int(ks.max()), dim=-1).values  # [num_rows, k_max], descending
    threshold = kth.gather(1, (ks - 1)[:, None])  # [num_rows, 1]
    return scores.masked_fill(scores < threshold, float("-inf"))


def _top_k_top_p(scores: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Top-k, then the smallest set of top tokens whose renormalised mass reaches p.

    A token is kept while the mass of the tokens ranked strictly above it is below p, so the
    most likely token always survives.
    """
    vocab = scores.shape[-1]
    sorted_scores, order = scores.sort(dim=-1, descending=True)  # [num_rows, vocab]
    ks = torch.tensor([vocab if k == -1 else min(k, vocab) for k in top_k], device=scores.device)
    ranks = torch.arange(vocab, device=scores.device)
    sorted_scores = sorted_scores.masked_fill(ranks[None, :] >= ks[:, None], float("-inf"))
    probs = sorted_scores.softmax(dim=-1)
    mass_above = probs.cumsum(dim=-1) - probs
    # p == 1 disables the filter: a float cumsum can reach 1 before the tail and cut it.
    ps = torch.tensor([p if p < 1.0 else 2.0 for p in top_p], dtype=torch.float32, device=scores.device)
    sorted_scores = sorted_scores.masked_fill(mass_above >= ps[:, None], float("-inf"))
    return torch.full_like(scores, float("-inf")).scatter_(1, order, sorted_scores)
