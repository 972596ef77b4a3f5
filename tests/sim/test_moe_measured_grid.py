"""A profiled MoE model fitted on a grid whose rows carry the distinct experts each step really
touched (harness.calibration.expert_steps), as an engine on random weights routes: independent
sequences about the expectation, sequences over one shared prefix alike (few experts). The column
then varies apart from the batch, so the fit prices an expert from it (not absorbed by the batch's
knots) and the repeated reads keep their own price; the simulator prices a step by the expected
count of its tokens. The same grid with the expected count in the column cannot tell the shared
rows' few experts from their repeated reads."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from engine.core.graph_sizes import GraphSizes
from sim.config import SimConfig
from sim.cost_model import make_cost_model
from sim.features import step_features
from sim.profiled import ProfiledCostModel
from tests.sim.helpers import decode_batch, plan, prefill
from tests.sim.moe_grid import GRAPHS, H100, LAUNCH_S, PHYSICS, ROUTING, ROW_S, SIZES, SKEW, SPEC

LAYERS = 8  # a measured count is a mean over the MoE layers


def routed(rng: np.random.Generator, tokens: int) -> float:
    """Distinct experts per layer of `tokens` independent tokens, each choosing k experts by the
    skewed popularity, averaged over LAYERS layers."""
    weights = np.arange(1, SPEC.num_experts + 1, dtype=float) ** -SKEW
    p = weights / weights.sum()
    k = SPEC.num_experts_per_tok
    return float(np.mean([len(np.unique(np.concatenate([rng.choice(SPEC.num_experts, k, replace=False, p=p)
                                                        for _ in range(tokens)]))) for _ in range(LAYERS)]))


def law(batch: int, distinct: float, context: int, repeated: int) -> float:
    return LAUNCH_S + ROW_S * batch + PHYSICS({"moe_distinct_experts": distinct, "decode_context_tokens": context,
                                               "decode_repeated_tokens": repeated})


def _row(batch: int, context: int, repeated: int, distinct: float, rng: np.random.Generator) -> dict:
    return dict(num_prefill_tokens=0, num_decode_tokens=batch, num_seqs=batch, num_sampled=batch, num_seeded=0,
                prefill_context_tokens=0, decode_context_tokens=context, decode_repeated_tokens=repeated,
                cuda_graph=1, graph_batch_size=batch, moe_distinct_experts=distinct,
                moe_expected_experts=ROUTING.distinct(batch),
                duration_s=law(batch, distinct, context, repeated) * rng.normal(1.0, 0.02))


def measured_grid(path: str, column: str) -> None:
    """Decode graphs at SIZES x five contexts and shared-prefix decodes (a 3,072-token prefix over
    1 or 8 groups at 32, 128, 256: each group's tokens route as 2 tokens do), durations by law()
    of the measured count; `column` is what the profile's moe_distinct_experts holds."""
    rng = np.random.default_rng(0)
    rows = [_row(b, b * c, 0, routed(rng, b), rng) for b in SIZES for c in (100, 400, 1000, 2000, 4000)]
    for groups in (1, 8):
        for batch in (32, 128, 256):
            prefix, tail = 3072, 256
            rows.append(_row(batch, batch * (prefix + tail), (batch - groups) * prefix, routed(rng, 2 * groups), rng))
    rows.append(dict(num_prefill_tokens=512, num_decode_tokens=0, num_seqs=1, num_sampled=1, num_seeded=0,
                     prefill_context_tokens=0, decode_context_tokens=0, cuda_graph=0, graph_batch_size=1,
                     moe_distinct_experts=ROUTING.distinct(512), moe_expected_experts=ROUTING.distinct(512),
                     duration_s=0.03))
    table = pd.DataFrame(rows)
    table.assign(moe_distinct_experts=table[column]).to_csv(path, index=False)


@pytest.fixture(scope="module")
def grids(tmp_path_factory) -> dict[str, str]:
    """Each column's grid, written once: drawing its routed counts takes a second or more, and a
    fixed seed makes it the same table every time. Each test fits its own model from it."""
    out = tmp_path_factory.mktemp("grids")
    paths = {column: str(out / f"{column}.csv") for column in ("moe_distinct_experts", "moe_expected_experts")}
    for column, path in paths.items():
        measured_grid(path, column)
    return paths


def _priced(grids: dict[str, str], column: str) -> ProfiledCostModel:
    path = grids[column]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost = make_cost_model(SPEC, H100, SimConfig(cost_model="profiled", profile_path=path,
                                                     moe_routing_skew=SKEW), GRAPHS)
    assert isinstance(cost, ProfiledCostModel)
    return cost


def test_measured_counts_price_an_expert_and_a_repeated_read(grids) -> None:
    fit = _priced(grids, "moe_distinct_experts").fits["decode_graph"]
    coefs = dict(zip(fit.linear_features, fit.linear_coefs))
    assert coefs["moe_distinct_experts"] == pytest.approx(PHYSICS.expert_s, rel=0.25)
    # a repeated read costs nothing here (law): its price cancels the context's, no more
    assert coefs["decode_repeated_tokens"] == pytest.approx(-PHYSICS.kv_token_s, rel=0.25)
    # the expected count cannot: the batch's knots absorb it, the repeated reads take the
    # shared rows' missing experts and a repeated read is priced below nothing
    fit = _priced(grids, "moe_expected_experts").fits["decode_graph"]
    coefs = dict(zip(fit.linear_features, fit.linear_coefs))
    assert "moe_distinct_experts" not in coefs
    assert coefs["decode_repeated_tokens"] < -1.5 * PHYSICS.kv_token_s


@pytest.mark.parametrize("batch", [3, 5, 12, 24, 40, 100, 200])
def test_a_simulated_step_is_priced_by_its_expected_experts(grids, batch: int) -> None:
    """Off the grid's sizes: the graph's rows all run, and its padding rows (token 0 at position 0,
    engine.cuda_graph) route alike, one token more (sim.features.read_sequences). Without them a
    batch of 3 in the graph of 4 is priced 15% short, of 5 in 8 10% (what served Qwen3-30B-A3B
    decodes showed: experiments/fidelity/h100_30b_r3)."""
    cost = _priced(grids, "moe_distinct_experts")
    step = decode_batch([1500] * batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        price = cost.step_time(step)
    padded = GRAPHS.decode[int(np.searchsorted(GRAPHS.decode, batch))]
    assert padded > batch
    assert price == pytest.approx(law(padded, ROUTING.distinct(batch + 1), batch * 1501, 0), rel=0.03)


def test_padding_rows_add_one_routing_token(grids) -> None:
    """A step's expected experts count its CUDA graph's padding rows as one more token; an eager
    step, or one that fills its graph, has none; a table row (a served run's replay) alike."""
    cost = _priced(grids, "moe_distinct_experts")
    distinct = cost.distinct_experts
    assert distinct is not None
    for batch, graphs, tokens in ((3, GRAPHS, 4), (4, GRAPHS, 4), (3, (), 3), (300, GRAPHS, 300)):
        features = step_features(decode_batch([100] * batch), graphs, distinct)
        assert features["moe_distinct_experts"] == pytest.approx(ROUTING.distinct(tokens))
        row = pd.DataFrame([{**features, "duration_s": 1e-3}]).drop(columns="moe_distinct_experts")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert cost.predict(row)[0] == pytest.approx(cost.predict_features(features))
    chunk = plan(prefill(100))  # a prefill graph of 128 tokens: 28 padding rows
    features = step_features(chunk, GraphSizes(prefill=(128,)), lambda sizes: float(len(sizes)))
    assert features["cuda_graph"] == 1 and features["moe_distinct_experts"] == 2.0
