"""The router's two orders agree (CPU, hypothesis): softmax, top-k, renormalise
(kernels.moe_reference.route, transformers' order) and top-k of the logits, then the softmax over
those k (route_topk_first, the order the Triton router kernel computes in). exp is increasing, so
the k largest logits are the k largest probabilities, and with renormalisation
p_j / sum_k p = exp(l_j - m) / sum_k exp(l - m): the partition function over all experts cancels.
Without renormalisation both are the full softmax at the chosen experts."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.moe_reference import route, route_topk_first


@st.composite
def routing_cases(draw):
    experts = draw(st.integers(1, 64))
    top_k = draw(st.integers(1, experts))
    tokens = draw(st.integers(0, 6))
    scale = draw(st.sampled_from([0.01, 1.0, 10.0, 60.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    # distinct logits per token (a random permutation, jittered): ties would let topk pick either
    gen = torch.Generator().manual_seed(seed)
    base = torch.stack([torch.randperm(experts, generator=gen) for _ in range(tokens)]) if tokens else \
        torch.empty(0, experts, dtype=torch.int64)
    logits = (base.double() + 0.5 * torch.rand(tokens, experts, generator=gen, dtype=torch.float64)) * scale / experts
    return logits, top_k, draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(routing_cases())
def test_topk_then_softmax_equals_softmax_then_topk_then_renormalise(case):
    logits, top_k, renormalize = case
    want_weights, want_ids = route(logits, top_k, renormalize)  # float64 logits: float32 softmax, cast back
    weights, ids = route_topk_first(logits, top_k, renormalize)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights.double(), want_weights.double(), rtol=1e-6, atol=1e-9)
    if renormalize and len(logits):
        torch.testing.assert_close(weights.sum(-1), torch.ones(len(logits)), rtol=1e-6, atol=0)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 32), st.integers(0, 2**31 - 1))
def test_weights_fall_with_the_slot(experts, seed):
    """Both orders give each token's experts by descending logit, so the weights never rise."""
    logits = torch.randn(5, experts, generator=torch.Generator().manual_seed(seed))
    for renormalize in (True, False):
        weights, _ = route_topk_first(logits, experts // 2 + 1, renormalize)
        assert bool((weights.diff(dim=-1) <= 0).all())
