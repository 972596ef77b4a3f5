"""How alike sequences over one prefix route (sim.moe_locality's routing groups, sim.moe_shared_prefix's
fit): a group's later members draw fresh for it with probability shared_fresh, among shared_cap
routings of its own."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.moe_locality import SequenceRouting
from sim.moe_shared_prefix import fit_shared_routing

members = st.lists(st.integers(1, 200), min_size=1, max_size=8)
groups_lists = st.lists(members, min_size=1, max_size=5)
caps = st.one_of(st.none(), st.integers(1, 60))


@settings(max_examples=60, deadline=None)
@given(groups_lists, st.floats(0.0, 10.0), st.sampled_from([0.0, 0.4, 1.0]))
def test_fresh_one_without_cap_is_every_sequence_apart(groups, locality, skew):
    routing = SequenceRouting(64, 6, skew, locality, 1.0)
    apart = SequenceRouting(64, 6, skew, locality)
    assert routing.distinct([tuple(g) for g in groups]) == pytest.approx(
        apart.distinct([n for g in groups for n in g]), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(groups_lists, st.floats(0.0, 10.0), st.sampled_from([0.0, 0.4, 1.0]))
def test_without_a_fresh_a_group_is_one_sequence(groups, locality, skew):
    """shared_fresh None: the rule without a measured one, each group one sequence of its tokens."""
    routing = SequenceRouting(64, 6, skew, locality)
    assert routing.distinct([tuple(g) for g in groups]) == pytest.approx(routing.distinct([sum(g) for g in groups]))


@settings(max_examples=80, deadline=None)
@given(groups_lists, st.floats(0.0, 10.0), st.floats(0.001, 1.0), caps, st.sampled_from([0.0, 0.5]), st.data())
def test_grouping_never_adds_experts_and_grows_with_fresh_and_cap(groups, locality, fresh, cap, skew, data):
    routing = SequenceRouting(64, 6, skew, locality, fresh, cap)
    grouped = routing.distinct([tuple(g) for g in groups])
    apart = routing.distinct([n for g in groups for n in g])
    first = routing.distinct([max(g) for g in groups])  # only each group's longest member
    assert first - 1e-9 <= grouped <= apart + 1e-9
    more = data.draw(st.floats(fresh, 1.0))
    assert SequenceRouting(64, 6, skew, locality, more, cap).distinct([tuple(g) for g in groups]) >= grouped - 1e-9
    if cap is not None:
        assert SequenceRouting(64, 6, skew, locality, fresh, None).distinct([tuple(g) for g in groups]) \
            >= grouped - 1e-9
        assert SequenceRouting(64, 6, skew, locality, fresh, cap * 2).distinct([tuple(g) for g in groups]) \
            >= grouped - 1e-9


def _draw_step(rng, groups, experts, k, locality, fresh, cap):
    """Distinct experts of one step drawn from the rule (uniform routing): each group's longest
    member routes as a sequence (token j draws a fresh k-subset with probability 1 / (1 + locality j));
    a later member's fresh draw is fresh for the group with probability `fresh` and then takes one
    of the group's `cap` routings (drawn when the group starts) at random, or a new one without a cap."""
    touched = np.zeros(experts, dtype=bool)

    def subset():
        return rng.choice(experts, size=k, replace=False)

    for group in groups:
        first, *later = sorted(group, reverse=True)
        for _ in range(int((rng.random(first) < 1.0 / (1.0 + locality * np.arange(first))).sum())):
            touched[subset()] = True
        pool = [subset() for _ in range(cap)] if cap else None
        for n in later:
            own = rng.random(n) < 1.0 / (1.0 + locality * np.arange(n))
            for _ in range(int((own & (rng.random(n) < fresh)).sum())):
                touched[pool[rng.integers(cap)] if pool else subset()] = True
    return int(touched.sum())


@pytest.mark.parametrize("fresh,cap", [(0.06, None), (0.06, 3), (0.3, 2), (0.5, None)])
def test_expectation_matches_drawn_routing(fresh, cap):
    rng = np.random.default_rng(0)
    experts, k, locality = 48, 4, 1.5
    routing = SequenceRouting(experts, k, 0.0, locality, fresh, cap)
    for groups in ([(1,) * 32], [(1,) * 4] * 6, [(64, 1, 1, 1)] + [(1,) * 16], [(16, 16, 16), (1,) * 8, (5,)]):
        drawn = np.mean([_draw_step(rng, groups, experts, k, locality, fresh, cap) for _ in range(500)])
        assert routing.distinct(groups) == pytest.approx(drawn, rel=0.04)


STEPS = [[(1,) * 32], [(1,) * 128], [(1,) * 4] * 8, [(1,) * 16] * 8, [(512,), (1,) * 64], [(1,) * 5] * 5]


@pytest.mark.parametrize("fresh,cap", [(0.06, 3), (0.2, None), (0.02, 8)])
def test_fit_recovers_the_figures_of_its_own_expectation(fresh, cap):
    routing = SequenceRouting(128, 8, 0.379, 2.0, fresh, cap)
    observed = [routing.distinct(step) for step in STEPS]
    got_fresh, got_cap = fit_shared_routing(STEPS, observed, 128, 8, 0.379, 2.0)
    assert got_fresh == pytest.approx(fresh, rel=0.05)
    if cap is None:  # no saturation to see: a cap past the largest group's draws, or none
        assert got_cap is None or got_cap > 20
    else:
        assert got_cap == cap


def test_fit_of_drawn_routing_prices_held_out_groups():
    """Fitted to drawn counts (noisy), the figures price groups the fit never saw within 10%."""
    rng = np.random.default_rng(2)
    experts, k, locality, fresh, cap = 48, 4, 1.0, 0.1, 3
    steps = [[(1,) * 32], [(1,) * 128], [(1,) * 4] * 6, [(1,) * 16] * 3, [(64,), (1,) * 32]]
    observed = [np.mean([_draw_step(rng, s, experts, k, locality, fresh, cap) for _ in range(60)]) for s in steps]
    got = SequenceRouting(experts, k, 0.0, locality, *fit_shared_routing(steps, observed, experts, k, 0.0, locality))
    for held in ([(1,) * 8] * 4, [(1,) * 64, (1,) * 2], [(32, 1, 1), (1,) * 10]):
        drawn = np.mean([_draw_step(rng, held, experts, k, locality, fresh, cap) for _ in range(300)])
        assert got.distinct(held) == pytest.approx(drawn, rel=0.1)


def test_bad_input():
    with pytest.raises(ValueError, match="moe_routing_shared_fresh"):
        SequenceRouting(8, 2, 0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="moe_routing_shared_fresh"):
        SequenceRouting(8, 2, 0.0, 1.0, 1.5)
    with pytest.raises(ValueError, match="moe_routing_shared_cap"):
        SequenceRouting(8, 2, 0.0, 1.0, 0.5, 0)
    with pytest.raises(ValueError, match="moe_routing_shared_cap"):
        SequenceRouting(8, 2, 0.0, 1.0, 0.5, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="moe_routing_shared_cap needs moe_routing_shared_fresh"):
        SequenceRouting(8, 2, 0.0, 1.0, None, 2)
    with pytest.raises(ValueError, match="one positive observed count"):
        fit_shared_routing([[(1, 1)]], [0.0], 8, 2)
    with pytest.raises(ValueError, match="no step has a routing group"):
        fit_shared_routing([[(1,), (4,)]], [3.0], 8, 2)
