"""Expert parallelism's pricing (sim.moe_ranks): the busiest rank's distinct experts and pairs
against routing simulated with numpy, their bounds by hypothesis, and the roofline: equal to TP's
pricing where the two must agree, the busiest rank's extra reads where they differ, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.moe import ExpertPhase, expected_distinct_experts, inclusion_probabilities
from sim.moe_ranks import RankBalance, RankExpertPhase, normal_max_moments
from sim.roofline import RooflineCostModel
from tests.sim.helpers import decode_batch, hardware, model
from tests.sim.test_moe_pricing import A3B
from tests.sim.test_moe_routing import _route


def _steps(tokens: int) -> int:
    # enough steps that the mean's standard error is well inside 2%: small batches' maxima are
    # small counts, relatively noisier
    return 3000 if tokens <= 4 else 400


def _simulate(experts: int, k: int, skew: float, ranks: int, tokens: int, seed: int = 0) -> tuple[float, float]:
    """Mean over _steps(tokens) steps of the busiest rank's (distinct experts, pairs), each step's
    experts placed on ranks at random (m per rank), uniform routing as a real top-k router draws it."""
    rng = np.random.default_rng(seed)
    per_rank = experts // ranks
    pi = inclusion_probabilities(experts, k, skew)
    distinct, pairs = [], []
    for _ in range(_steps(tokens)):
        ids = np.argsort(rng.random((tokens, experts)), axis=1)[:, :k] if skew == 0 else _route(pi, rng, tokens)
        owner = rng.permutation(experts) // per_rank
        pairs.append(np.bincount(owner[ids].ravel(), minlength=ranks).max())
        distinct.append(np.bincount(owner[np.unique(ids)], minlength=ranks).max())
    return float(np.mean(distinct)), float(np.mean(pairs))


@pytest.mark.parametrize("tokens", [64, 256])
def test_one_expert_per_rank_busiest_pairs_match_simulation(tokens: int) -> None:
    # 128 ranks of one expert each: the busiest rank's pairs are the most tokens any expert got
    _, want = _simulate(128, 8, 0.0, 128, tokens)
    distinct, pairs = RankBalance(128, 8, 0.0, 128).busiest(tokens)
    assert pairs == pytest.approx(want, rel=0.02)
    assert distinct == 1.0


@pytest.mark.parametrize(("experts", "k", "skew", "ranks"),
                         [(128, 8, 0.0, 2), (128, 8, 0.0, 8), (64, 6, 0.0, 4), (128, 8, 0.5, 2), (128, 8, 1.0, 8)])
def test_busiest_rank_matches_simulation(experts: int, k: int, skew: float, ranks: int) -> None:
    balance = RankBalance(experts, k, skew, ranks)
    for tokens in (1, 4, 16, 64):
        want_distinct, want_pairs = _simulate(experts, k, skew, ranks, tokens, seed=tokens)
        distinct, pairs = balance.busiest(tokens)
        # skewed routing: the pair probabilities are a mean-field estimate (module docstring)
        rel = 0.02 if skew == 0 else 0.04
        assert distinct == pytest.approx(want_distinct, rel=rel), (tokens, "distinct")
        assert pairs == pytest.approx(want_pairs, rel=rel), (tokens, "pairs")


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[int, int, float, int]:
    ranks = draw(st.sampled_from([1, 2, 4, 8]))
    experts = ranks * draw(st.integers(1, 32))
    return experts, draw(st.integers(1, experts)), draw(st.sampled_from([0.0, 0.3, 1.0, 2.0])), ranks


@settings(max_examples=60, deadline=None)
@given(_layouts(), st.integers(1, 2000))
def test_busiest_rank_is_bounded(layout: tuple[int, int, float, int], tokens: int) -> None:
    experts, k, skew, ranks = layout
    distinct, pairs = RankBalance(experts, k, skew, ranks).busiest(tokens)
    total = expected_distinct_experts(tokens, experts, k, skew)
    per_rank = experts // ranks
    # at least the mean rank, at most what one rank holds (and at least the one-rank total at n=1)
    assert total / ranks - 1e-9 <= distinct <= min(per_rank, total) + 1e-9
    assert tokens * k / ranks - 1e-9 <= pairs <= tokens * min(k, per_rank) + 1e-9
    if ranks == 1:
        assert distinct == pytest.approx(total) and pairs == pytest.approx(tokens * k)


def test_normal_maximum_moments() -> None:
    # E[max of 2] = 1/sqrt(pi) and E[max^2] = 1 (max^2 + min^2 = Z1^2 + Z2^2); E[max of 1] = 0
    assert normal_max_moments(2) == pytest.approx((1 / np.sqrt(np.pi), 1.0), abs=1e-6)
    assert normal_max_moments(1) == pytest.approx((0.0, 1.0), abs=1e-6)


def _decode_times(tp: int, expert_parallel: bool, batch: int) -> tuple[float, float]:
    """A decode step's price and its expert phase's roofline part (the busiest rank's reads)."""
    cost = RooflineCostModel(A3B, hardware("h200"), tp, routing_skew=0.0, expert_parallel=expert_parallel)
    phase = cost._experts
    experts = phase.roofline_time(batch) if isinstance(phase, RankExpertPhase) else phase.time(batch)
    return cost.step_time(decode_batch([512] * batch)), experts


def test_ep_equals_tp_where_it_must() -> None:
    # one rank: expert parallelism is no placement at all
    for batch in (1, 16, 256):
        assert _decode_times(1, True, batch) == _decode_times(1, False, batch)
    for tp in (2, 4):
        ep_cost = RooflineCostModel(A3B, hardware("h200"), tp, expert_parallel=True)
        tp_cost = RooflineCostModel(A3B, hardware("h200"), tp)
        ep_phase, tp_phase = ep_cost._experts, tp_cost._experts
        assert isinstance(ep_phase, RankExpertPhase) and isinstance(tp_phase, ExpertPhase)
        # every expert touched: E / tp whole experts read the bytes of E slices of 1 / tp
        per_rank = A3B.num_experts // tp
        assert ep_phase._seconds_per_expert * per_rank == pytest.approx(tp_phase._seconds_per_expert * A3B.num_experts)
        # the rest of the step (attention, routers, dense parts, the combine all-reduce) is the same
        for batch in (1, 64):
            ep, tp_only = (c.phase_times(batch, batch, 512 * batch, 512 * batch, batch) for c in (ep_cost, tp_cost))
            ep.pop("experts")
            tp_only.pop("experts")
            assert ep == tp_only
            assert ep["communication"] > 0


def test_ep_pays_for_the_busiest_rank_at_small_batches() -> None:
    # 8 tokens touch about 51 experts; with whole experts a rank reads its busiest share, more
    # than half of them at full width, where TP reads all 51 at half width
    ep, tp_only = _decode_times(2, True, 8)[1], _decode_times(2, False, 8)[1]
    distinct, _ = RankBalance(128, 8, 0.0, 2).busiest(8)
    assert distinct > expected_distinct_experts(8, 128, 8) / 2
    assert ep > tp_only
    assert ep / tp_only == pytest.approx(distinct / (expected_distinct_experts(8, 128, 8) / 2), rel=0.05)


def test_bad_expert_parallel_is_refused() -> None:
    with pytest.raises(ValueError, match="expert_parallel=true needs a mixture-of-experts model"):
        RooflineCostModel(model("qwen3-8b"), hardware("h200"), 2, expert_parallel=True)
    with pytest.raises(ValueError, match="num_experts=6 must be an int|dividing num_experts=6"):
        RankBalance(6, 2, 0.0, 4)
