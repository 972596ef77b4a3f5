"""A profiled model of an MoE model fitted on a profiling grid as the held-out protocol builds it
(harness.fidelity.routing): every decode shape at a captured graph size, its distinct experts the
expectation at the batch's token count, so the column is a function of the batch. The fit must
not split the step's cost between the batch and the experts by noise: priced off the grid's sizes
(a batch padded up to a graph) a step stays near the physical law the grid was measured from, and
never below the weights it must read."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import SimConfig
from sim.cost_model import make_cost_model
from sim.features import step_features
from sim.piecewise import PiecewiseLinearFit, collinear
from sim.profiled import ProfiledCostModel
from tests.sim.helpers import decode_batch
from tests.sim.moe_grid import GRAPHS, H100, LAUNCH_S, PHYSICS, ROUTING, ROW_S, SIZES, SKEW, SPEC


def law(batch: int, padded: int, context: int) -> float:
    """The fake device's step (tests.sim.moe_grid): a padded graph runs its padded rows, and its
    padding rows (token 0 at position 0, engine.graph_buffers) route alike: one more token's experts."""
    distinct = ROUTING.distinct(batch + (padded > batch))
    return LAUNCH_S + ROW_S * padded + PHYSICS({"moe_distinct_experts": distinct, "decode_context_tokens": context,
                                                "decode_repeated_tokens": 0})


def grid_profile(path: str) -> None:
    """Decode graphs as harness.calibration.grid measures them: five contexts at most captured sizes,
    one or two at some (too few for a knot of their own: interpolated between knots), each duration
    measured with 3% noise, sampled with seeds; one prefill (a profile needs one); the expected
    distinct experts of each shape's tokens."""
    rng = np.random.default_rng(0)
    rows = []
    for batch in GRAPHS.decode:
        contexts = (100, 400, 1000, 2000, 4000) if batch in SIZES else (400, 2000)[:1 + batch % 2]
        for per_seq in contexts:
            context = batch * per_seq
            rows.append(dict(num_prefill_tokens=0, num_decode_tokens=batch, num_seqs=batch, num_sampled=batch,
                             num_seeded=batch, prefill_context_tokens=0, decode_context_tokens=context, cuda_graph=1,
                             graph_batch_size=batch, duration_s=law(batch, batch, context) * rng.normal(1.0, 0.03)))
    rows.append(dict(num_prefill_tokens=512, num_decode_tokens=0, num_seqs=1, num_sampled=1, num_seeded=1,
                     prefill_context_tokens=0, decode_context_tokens=0, cuda_graph=0, graph_batch_size=1,
                     duration_s=0.03))
    table = pd.DataFrame(rows)
    tokens = table.num_decode_tokens + table.num_prefill_tokens
    table.assign(moe_distinct_experts=[ROUTING.distinct(int(n)) for n in tokens]).to_csv(path, index=False)


@pytest.fixture(scope="module")
def priced(tmp_path_factory) -> ProfiledCostModel:
    path = str(tmp_path_factory.mktemp("moe") / "grid.csv")
    grid_profile(path)
    sim = SimConfig(cost_model="profiled", profile_path=path, moe_routing_skew=SKEW)
    cost = make_cost_model(SPEC, H100, sim, GRAPHS)
    assert isinstance(cost, ProfiledCostModel)
    return cost


@pytest.mark.parametrize("batch", [3, 5, 7, 12, 25, 40, 100, 200])
def test_a_padded_decode_step_is_priced_near_the_law(priced: ProfiledCostModel, batch: int) -> None:
    step = decode_batch([1500] * batch)
    padded = step_features(step, GRAPHS)["graph_batch_size"]
    assert padded > batch  # off the grid's sizes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        price = priced.step_time(step)
    # the fit prices the padded graph's experts, D(padded), where the padding rows add one token's:
    # within the experts that padding leaves untouched (at most 10.6 of 128 here, about 1.5 ms)
    truth = law(batch, int(padded), step_features(step, GRAPHS)["decode_context_tokens"])
    assert price == pytest.approx(truth, rel=0.2)


def test_the_grid_cannot_separate_the_experts_from_the_batch(priced: ProfiledCostModel) -> None:
    fit = priced.fits["decode_graph"]
    assert "moe_distinct_experts" not in fit.linear_features  # absorbed by the batch's knots
    assert "moe_distinct_experts" in {name for name, _, _ in fit.ranges}  # still guarded
    assert priced.uses_moe_features


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 256), st.integers(1, 8000))
def test_no_decode_step_is_priced_below_its_weight_reads(priced: ProfiledCostModel, batch: int, per_seq: int) -> None:
    step = decode_batch([per_seq] * batch)
    features = step_features(step, GRAPHS, priced.distinct_experts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert priced.predict_features(features) >= PHYSICS(features)


def test_a_fit_that_undercuts_the_weights_is_floored() -> None:
    fit = PiecewiseLinearFit("graph_batch_size", (1.0, 256.0), (1e-4, 1e-4), (), (), ())
    model = ProfiledCostModel({"prefill": fit, "decode_graph": fit}, GRAPHS)
    features = step_features(decode_batch([1000] * 16), GRAPHS, lambda sizes: ROUTING.distinct(sum(sizes)))
    assert model.predict_features(features) == pytest.approx(1e-4)  # no floor: what the fit says
    model.floor = PHYSICS
    assert model.predict_features(features) == pytest.approx(PHYSICS(features))
    # an expert of each of 48 layers: 48 x 3 x 2048 x 768 bf16 (453 MB) at 3.35 TB/s; the rest
    # (attention, routers, norms, LM head): 2.46 GB
    assert PHYSICS.expert_s == pytest.approx(0.1352e-3, rel=1e-3)
    assert PHYSICS.others_s == pytest.approx(0.734e-3, rel=1e-3)


def test_collinear_is_the_share_of_variance_the_others_leave() -> None:
    rng = np.random.default_rng(0)
    size = rng.integers(1, 64, 200).astype(float)
    others = [size, size**2]
    assert collinear(3 * size - size**2, others)
    assert collinear(np.full(200, 5.0), others)  # a constant carries nothing
    assert not collinear(rng.normal(size=200), others)
    assert not collinear(size, [])
