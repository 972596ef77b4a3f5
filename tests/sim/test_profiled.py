"""The profiled model recovers a known step-time law from synthetic profiles and guards its range."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from engine.core.graph_sizes import decode_graph_sizes
from sim.features import step_features
from sim.profiled import ExtrapolationWarning, ProfiledCostModel
from sim.profiled_validation import holdout_validation, relative_errors
from tests.sim.helpers import decode, decode_batch, plan, prefill

GRAPH = decode_graph_sizes(512, 512)
TRUE_LINEAR = {"prefill_attention_pairs": 3e-12, "decode_context_tokens": 2e-8, "num_seqs": 1e-5}
DECODE_CONTEXT = 3e-8


def true_time(f):
    if f["num_prefill_tokens"]:
        # memory-bound floor, then compute-bound: a hinge at 2000 tokens
        return max(1e-3, 5e-7 * f["num_tokens"]) + sum(c * f[k] for k, c in TRUE_LINEAR.items())
    # a graph replay costs what its padded batch costs
    return 1.5e-3 + 5e-6 * f["graph_batch_size"] + DECODE_CONTEXT * f["decode_context_tokens"]


def grid_plans():
    plans = []
    for tokens in (16, 64, 256, 1000, 2000, 4000, 8192, 16384):
        for seqs in (1, 4, 16):
            for cached in (0, 1024, 4096):
                plans.append(plan(*(prefill(tokens // seqs, cached, rid=str(i)) for i in range(seqs))))
        for decodes in (8, 64):  # mixed steps
            decodes_ = [decode(700 + 13 * i, rid=f"d{i}") for i in range(decodes)]
            plans.append(plan(prefill(tokens, 512, rid="p"), *decodes_))
    for batch in (1, 2, 3, 8, 20, 64, 100, 256):
        for context in (128, 1024, 4096):
            plans.append(decode_batch([context + i for i in range(batch)]))
    return plans


def profile(noise=0.0, seed=0, graph=GRAPH):
    rng = np.random.default_rng(seed)
    rows = []
    for p in grid_plans():
        f = step_features(p, graph)
        rows.append({**f, "duration_s": true_time(f) * (1 + noise * rng.standard_normal())})
    return pd.DataFrame(rows)


def test_noiseless_fit_recovers_the_coefficients():
    model = ProfiledCostModel.fit(profile(), GRAPH)
    fit = model.fits["prefill"]
    assert dict(zip(fit.linear_features, fit.linear_coefs)) == pytest.approx(TRUE_LINEAR, rel=1e-6)
    assert dict(zip(model.fits["decode_graph"].linear_features, model.fits["decode_graph"].linear_coefs)) == \
        pytest.approx({"decode_context_tokens": DECODE_CONTEXT}, rel=1e-6)
    knots = dict(zip(fit.knots, fit.knot_values))
    assert knots[2000.0] == pytest.approx(1e-3, rel=1e-6) and knots[16384.0] == pytest.approx(5e-7 * 16384, rel=1e-6)


@pytest.mark.parametrize("step", [
    plan(prefill(3000, 2000)),                         # between measured token counts
    plan(prefill(700, 0, rid="a"), prefill(900, 300, rid="b"), decode(2000)),
    decode_batch([500] * 40),                           # pads to the 48 graph, between measured batches
    decode_batch([3000] * 7),
])
def test_predicts_unmeasured_steps_inside_the_range_without_warning(step):
    model = ProfiledCostModel.fit(profile(), GRAPH)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predicted = model.step_time(step)
    assert predicted == pytest.approx(true_time(step_features(step, GRAPH)), rel=1e-6)


def test_noisy_fit_is_close_on_held_out_steps():
    model, held_out = holdout_validation(profile(noise=0.01, seed=1), test_fraction=0.3, seed=2,
                                         graphs=GRAPH)
    fit = model.fits["prefill"]
    coefs = dict(zip(fit.linear_features, fit.linear_coefs))
    assert coefs["prefill_attention_pairs"] == pytest.approx(TRUE_LINEAR["prefill_attention_pairs"], rel=0.1)
    assert len(held_out) > 20
    assert np.median(np.abs(held_out["rel_error"])) < 0.02
    assert np.abs(held_out["rel_error"]).max() < 0.1


def test_warns_once_per_feature_outside_the_measured_range():
    model = ProfiledCostModel.fit(profile(), GRAPH)
    with pytest.warns(ExtrapolationWarning) as record:
        beyond = model.step_time(plan(prefill(32768)))
    messages = sorted(str(w.message) for w in record)
    assert len(messages) == 2  # tokens and attention pairs are both beyond the profile
    assert "num_tokens=32768 outside the profiled range [16, 16448]" in messages[0]
    assert "prefill_attention_pairs" in messages[1]
    assert beyond > model.step_time(plan(prefill(16384)))  # the last segment's trend continues
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.step_time(plan(prefill(40000)))  # same feature: already warned
    with pytest.warns(ExtrapolationWarning, match="graph_batch_size"):
        model.step_time(decode_batch([1000] * 300))


def test_coefficients_round_trip_through_csv(tmp_path):
    model = ProfiledCostModel.fit(profile(noise=0.01), GRAPH)
    model.to_csv(tmp_path / "coef.csv")
    loaded = ProfiledCostModel.load(tmp_path / "coef.csv", GRAPH)
    measured = profile(noise=0.01, seed=5)
    assert np.allclose(loaded.predict(measured), model.predict(measured), rtol=1e-12)
    profile().to_csv(tmp_path / "steps.csv", index=False)
    refit = ProfiledCostModel.load(tmp_path / "steps.csv", GRAPH)
    assert np.abs(relative_errors(refit, profile())).max() < 1e-6


def test_decode_steps_fall_back_with_a_warning_when_their_regime_was_not_profiled():
    model = ProfiledCostModel.fit(profile(graph=()), GRAPH)  # the engine ran eager
    assert set(model.fits) == {"prefill", "decode_eager"}
    step = decode_batch([1000] * 5)
    with pytest.warns(ExtrapolationWarning, match="no 'decode_graph' steps were profiled"):
        predicted = model.step_time(step)
    assert predicted == pytest.approx(true_time(step_features(step, ())), rel=1e-6)


def test_table_errors_name_the_missing_columns(tmp_path):
    with pytest.raises(ValueError, match="decode_context_tokens"):
        ProfiledCostModel.fit(profile().drop(columns=["decode_context_tokens"]))
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="neither"):
        ProfiledCostModel.load(tmp_path / "x.csv")
    (tmp_path / "ragged.csv").write_text("a\n1\n1,2,3\n")
    with pytest.raises(ValueError, match="ragged.csv: not a readable CSV"):
        ProfiledCostModel.load(tmp_path / "ragged.csv")
    decode_only = profile()
    with pytest.raises(ValueError, match="prefill"):
        ProfiledCostModel.fit(decode_only[decode_only["num_prefill_tokens"] == 0])


def test_attention_pairs_are_derived_for_single_chunk_tables():
    single = profile()
    single = single[single["num_seqs"] - single["num_decode_tokens"] <= 1]
    derived = ProfiledCostModel.fit(single.drop(columns=["prefill_attention_pairs", "cuda_graph",
                                                         "graph_batch_size", "num_tokens"]), GRAPH)
    # without the graph columns every decode row counts as eager: it is priced by its real batch
    assert set(derived.fits) == {"prefill", "decode_eager"}
    step = plan(prefill(3000, 2000))
    assert derived.step_time(step) == pytest.approx(true_time(step_features(step, GRAPH)), rel=1e-6)
