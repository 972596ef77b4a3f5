"""The expected number of distinct experts a step touches (sim.moe): its invariants, a Monte Carlo
check against simulated routing, and the skew estimated back from simulated expert counts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.moe import ExpertRouting, expected_distinct_experts, fit_routing_skew, inclusion_probabilities


@st.composite
def routings(draw: st.DrawFn) -> tuple[int, int, float]:
    experts = draw(st.integers(1, 256))
    return experts, draw(st.integers(1, experts)), draw(st.floats(0.0, 3.0))


@given(routings(), st.integers(1, 5000))
@settings(max_examples=200, deadline=None)
def test_distinct_is_bounded_increasing_and_k_at_one_token(routing: tuple[int, int, float], tokens: int) -> None:
    experts, k, skew = routing
    d = expected_distinct_experts(tokens, experts, k, skew)
    assert d <= min(experts, tokens * k) + 1e-9
    assert d >= k - 1e-9  # one token alone touches its k experts
    assert expected_distinct_experts(1, experts, k, skew) == pytest.approx(k, rel=1e-9)
    assert expected_distinct_experts(tokens + 1, experts, k, skew) >= d - 1e-9
    # concave: each further token adds no more experts than the one before it
    gain = expected_distinct_experts(tokens + 1, experts, k, skew) - d
    assert gain <= d - expected_distinct_experts(tokens - 1, experts, k, skew) + 1e-9


@given(routings())
@settings(max_examples=100, deadline=None)
def test_distinct_approaches_all_experts(routing: tuple[int, int, float]) -> None:
    experts, k, skew = routing
    assert expected_distinct_experts(10**9, experts, k, skew) == pytest.approx(experts, rel=1e-6)


@given(routings(), st.integers(2, 2000), st.floats(0.05, 2.0))
@settings(max_examples=200, deadline=None)
def test_skew_touches_fewer_experts(routing: tuple[int, int, float], tokens: int, more: float) -> None:
    experts, k, skew = routing
    assert expected_distinct_experts(tokens, experts, k, skew + more) <= \
        expected_distinct_experts(tokens, experts, k, skew) + 1e-9


@given(routings())
@settings(max_examples=100, deadline=None)
def test_inclusion_probabilities_sum_to_k(routing: tuple[int, int, float]) -> None:
    experts, k, skew = routing
    pi = inclusion_probabilities(experts, k, skew)
    assert pi.sum() == pytest.approx(k, rel=1e-9)
    assert np.all(pi <= 1.0 + 1e-12) and np.all(pi > 0) and np.all(np.diff(pi) <= 1e-12)


def test_uniform_is_the_closed_form() -> None:
    # E (1 - (1 - k/E)^B): Qwen3-30B-A3B's 128 experts, top-8
    for tokens in (1, 2, 16, 64, 256):
        assert expected_distinct_experts(tokens, 128, 8) == pytest.approx(128 * (1 - (1 - 8 / 128) ** tokens))
    assert expected_distinct_experts(tokens, 128, 8, 0.0) == pytest.approx(
        expected_distinct_experts(tokens, 128, 8, 1e-12), rel=1e-6)


def _route(pi: np.ndarray, rng: np.random.Generator, tokens: int) -> np.ndarray:
    """[tokens, k] experts: each token chooses k distinct experts with inclusion probabilities exactly
    pi (systematic sampling: the points u, u+1, ..., u+k-1 on the cumulative pi, u ~ U(0, 1))."""
    edges = np.concatenate([[0.0], np.cumsum(pi)])
    k = int(round(pi.sum()))
    points = rng.random((tokens, 1)) + np.arange(k)
    return np.minimum(np.searchsorted(edges, points, side="right") - 1, len(pi) - 1)


@pytest.mark.parametrize(("experts", "k", "skew"), [(128, 8, 0.0), (64, 6, 0.0), (128, 8, 0.8), (60, 4, 1.5)])
def test_monte_carlo_matches(experts: int, k: int, skew: float) -> None:
    """The formula against simulated routing, 400 steps per batch size: within 2% (the Monte Carlo
    mean's standard error is below 0.5% at these sizes)."""
    rng = np.random.default_rng(0)
    pi = inclusion_probabilities(experts, k, skew)
    for tokens in (1, 3, 16, 64, 200):
        if skew == 0:  # a real uniform router: a random k-subset per token
            counts = [len(np.unique(np.concatenate([rng.choice(experts, k, replace=False) for _ in range(tokens)])))
                      for _ in range(400)]
        else:
            counts = [len(np.unique(_route(pi, rng, tokens))) for _ in range(400)]
        assert np.mean(counts) == pytest.approx(expected_distinct_experts(tokens, experts, k, skew), rel=0.02)


@pytest.mark.parametrize("skew", [0.0, 0.5, 1.2])
def test_skew_is_estimated_from_observed_counts(skew: float) -> None:
    """Per-layer expert counts of 4,096 routed tokens drawn at a known skew give it back within
    0.06 (at skew 0: the upward bias of ranking noisy counts)."""
    rng = np.random.default_rng(1)
    experts, k = 128, 8
    pi = inclusion_probabilities(experts, k, skew)
    rows = []
    for _ in range(4):  # four layers, each with its own most popular experts
        chosen = rng.permutation(experts)[_route(pi, rng, 4096)]
        rows.append(np.bincount(chosen.ravel(), minlength=experts))
    assert fit_routing_skew(rows, k) == pytest.approx(skew, abs=0.06)


def test_bad_counts_and_settings_fail_in_one_line() -> None:
    with pytest.raises(ValueError, match="all zero"):
        fit_routing_skew([0, 0, 0], 1)
    with pytest.raises(ValueError, match="non-negative histogram"):
        fit_routing_skew([3, -1], 1)
    with pytest.raises(ValueError, match="moe_routing_skew"):
        ExpertRouting(8, 2, -0.5)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        expected_distinct_experts(4, 8, 9)
