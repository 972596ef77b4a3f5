"""harness.fidelity.conformal: scores, the split-conformal margin, and the class held out of its own
margin; on exchangeable synthetic classes the widened intervals cover about the level asked."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from harness.fidelity.conformal import leave_one_class_out, margin, margins, scores


def _cell(workload: str, engine: float, lo: float = 0.9, hi: float = 1.1, load: str = "0.5", metric: str = "ttft_p50_s",
          model: str = "m") -> dict:
    return {"model": model, "hardware": "h", "workload": workload, "load": load, "metric": metric,
            "engine": engine, "sim": 1.0, "sim_lo": lo, "sim_hi": hi}


def test_a_score_is_the_log_distance_outside_the_interval_and_negative_inside():
    table = pd.DataFrame([_cell("a", 1.21), _cell("a", 0.81), _cell("a", 1.0), _cell("a", 1.0, lo=float("nan"))])
    s = scores(table)
    assert s[0] == pytest.approx(math.log(1.21 / 1.1)) and s[1] == pytest.approx(math.log(0.9 / 0.81))
    assert s[2] == pytest.approx(math.log(1.0 / 1.1)) and math.isnan(s[3])


def test_the_margin_is_the_conformal_quantile_never_below_zero():
    values = np.arange(1, 20) / 100.0  # 19 scores: the ceil(20 x 0.9) = 18th
    assert margin(values) == pytest.approx(0.18)
    assert margin(values[:5]) == pytest.approx(0.05)  # ceil(6 x 0.9) = 6 > 5: the largest
    assert margin(-values) == 0.0 and math.isnan(margin(np.array([np.nan])))


def test_a_class_never_sets_its_own_margin_and_a_served_cell_scores_its_worst_metric():
    rows = [_cell("a", 1.32), _cell("a", 1.0, metric="tpot_p50_s")]  # a misses by 20% (log 0.182)
    rows += [_cell(w, 1.0) for w in ("b", "c")]
    out = leave_one_class_out(pd.DataFrame(rows)).set_index(["workload", "metric"])
    assert out.loc[("a", "ttft_p50_s"), "conformal_margin"] == 0.0  # b and c are inside
    assert not out.loc[("a", "ttft_p50_s"), "in_interval_conformal"]
    # b's margin is the largest of a's (its worst metric) and c's: a's miss widens b's interval
    assert out.loc[("b", "ttft_p50_s"), "conformal_margin"] == pytest.approx(math.log(1.32 / 1.1))
    assert out.loc[("b", "ttft_p50_s"), "sim_hi_conformal"] == pytest.approx(1.32)
    per_model = margins(pd.DataFrame(rows))
    assert per_model.loc[0, "served_cells"] == 3


def test_models_are_calibrated_apart():
    rows = [_cell("a", 2.0, model="x"), _cell("b", 1.0, model="x"),
            _cell("a", 1.0, model="y"), _cell("b", 1.0, model="y")]
    out = leave_one_class_out(pd.DataFrame(rows))
    assert (out.loc[out["model"] == "y", "conformal_margin"] == 0).all()
    assert out.loc[(out["model"] == "x") & (out["workload"] == "b"), "conformal_margin"].iloc[0] > 0.5


def test_exchangeable_classes_are_covered_about_as_asked():
    """40 classes of 3 loads x 4 metrics whose engine values scatter twice as wide as their
    intervals: held out by class, the widened intervals hold 85-97% of cells (90% asked)."""
    rng = np.random.default_rng(0)
    rows = []
    for c in range(40):
        bias = rng.normal(0, 0.06)  # a class's shared error, as the held-out table's are
        for load in ("0.5", "0.8", "0.95"):
            for metric in ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s"):
                rows.append(_cell(f"c{c}", math.exp(bias + rng.normal(0, 0.04)), lo=0.95, hi=1.05, load=load,
                                  metric=metric))
    out = leave_one_class_out(pd.DataFrame(rows))
    raw = ((out["sim_lo"] <= out["engine"]) & (out["engine"] <= out["sim_hi"])).mean()
    covered = out["in_interval_conformal"].astype(float).mean()
    assert raw < 0.6 and 0.85 <= covered <= 0.99
