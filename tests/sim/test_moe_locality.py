"""Routing locality (sim.moe_locality): the distinct experts of a step counted from its sequences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import SimConfig
from sim.features import row_sequences
from sim.moe import ExpertRouting
from sim.moe_locality import SequenceRouting, fit_routing_locality, fresh_draws

routings = st.tuples(st.integers(2, 64), st.integers(1, 8), st.sampled_from([0.0, 0.4, 1.0])).filter(
    lambda r: r[1] <= r[0])
sizes_lists = st.lists(st.integers(1, 300), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(routings, sizes_lists)
def test_neutral_locality_is_independent_routing(routing, sizes):
    experts, k, skew = routing
    local = SequenceRouting(experts, k, skew, 0.0).distinct(sizes)
    assert local == pytest.approx(ExpertRouting(experts, k, skew).distinct(sum(sizes)), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(routings, sizes_lists, st.floats(0.01, 50.0), st.data())
def test_monotone_and_bounded(routing, sizes, locality, data):
    experts, k, skew = routing
    model = SequenceRouting(experts, k, skew, locality)
    value = model.distinct(sizes)
    assert k - 1e-9 <= value <= min(experts, k * sum(sizes)) + 1e-9
    grown = list(sizes)
    grown[data.draw(st.integers(0, len(sizes) - 1))] += data.draw(st.integers(1, 50))
    assert model.distinct(grown) >= value - 1e-9  # one more token never touches fewer experts
    assert model.distinct(sizes + [1]) >= value - 1e-9  # nor one more sequence
    # tokens that route alike touch no more than independent ones
    assert value <= ExpertRouting(experts, k, skew).distinct(sum(sizes)) + 1e-9


@given(routings, st.integers(1, 200), st.floats(0.0, 100.0))
def test_a_decode_batch_routes_independently_at_any_locality(routing, batch, locality):
    experts, k, skew = routing
    assert SequenceRouting(experts, k, skew, locality).distinct([1] * batch) == pytest.approx(
        ExpertRouting(experts, k, skew).distinct(batch), rel=1e-9)


def test_fresh_draws():
    assert fresh_draws(1, 5.0) == 1.0
    assert fresh_draws(100, 0.0) == 100.0
    assert fresh_draws(2048, 2.0) == pytest.approx(0.5 * (np.log(2048) + 0.5772 + 2 * np.log(2)), rel=0.01)


def _draw_step(rng, sizes, experts, k, locality):
    """Distinct experts of one step drawn from the model (uniform routing): token j of a sequence
    draws a fresh k-subset with probability 1 / (1 + locality j), else reuses an earlier token's."""
    touched = np.zeros(experts, dtype=bool)
    for n in sizes:
        fresh = rng.random(n) < 1.0 / (1.0 + locality * np.arange(n))
        for _ in range(int(fresh.sum())):  # a reused top-k touches nothing new
            touched[rng.choice(experts, size=k, replace=False)] = True
    return int(touched.sum())


def test_expectation_matches_drawn_routing():
    rng = np.random.default_rng(0)
    experts, k, locality = 48, 4, 1.5
    model = SequenceRouting(experts, k, 0.0, locality)
    for sizes in ([16], [256], [64, 64, 64], [100, 1, 1, 1, 1]):
        drawn = np.mean([_draw_step(rng, sizes, experts, k, locality) for _ in range(600)])
        assert model.distinct(sizes) == pytest.approx(drawn, rel=0.03)


@pytest.mark.parametrize("locality", [0.3, 2.0, 8.0])
def test_fit_recovers_the_locality_of_drawn_routing(locality):
    rng = np.random.default_rng(1)
    experts, k = 48, 4
    steps = [[16], [64], [256], [1024], [16] * 4, [64] * 4, [256] * 4, [8] * 8]
    observed = [np.mean([_draw_step(rng, s, experts, k, locality) for _ in range(80)]) for s in steps]
    assert fit_routing_locality(steps, observed, experts, k) == pytest.approx(locality, rel=0.2)


def test_fit_of_independent_routing_is_near_zero():
    model = ExpertRouting(48, 4)
    steps = [[16], [64], [8] * 4, [2] * 6]
    assert fit_routing_locality(steps, [model.distinct(sum(s)) for s in steps], 48, 4) < 1e-2


def test_bad_input():
    with pytest.raises(ValueError, match="moe_routing_locality"):
        SequenceRouting(8, 2, 0.0, -1.0)
    with pytest.raises(ValueError, match="SimConfig.moe_routing_locality"):
        SimConfig(moe_routing_locality=-0.5)
    with pytest.raises(ValueError, match="one positive observed count"):
        fit_routing_locality([[4]], [0.0], 8, 2)


def test_row_sequences():
    assert row_sequences(10, 0, 3) == [4, 3, 3]
    assert row_sequences(64, 8, 9) == [64] + [1] * 8
    assert row_sequences(0, 5, 5) == [1] * 5
