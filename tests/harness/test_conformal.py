"""harness.fidelity.conformal: scores, the finite-sample margin (infinite with too few cells), the
class held out of its own margin, groups calibrated apart; on exchangeable synthetic groups every
group's widened intervals cover at least the level asked."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.fidelity.conformal import fewest_cells, leave_one_class_out, margin, margins, rank, scores


def _cell(workload: str, engine: float, lo: float = 0.9, hi: float = 1.1, load: str = "0.5", metric: str = "ttft_p50_s",
          model: str = "m", hardware: str = "h") -> dict:
    return {"model": model, "hardware": hardware, "workload": workload, "load": load, "metric": metric,
            "engine": engine, "sim": 1.0, "sim_lo": lo, "sim_hi": hi}


def test_a_score_is_the_log_distance_outside_the_interval_and_negative_inside():
    table = pd.DataFrame([_cell("a", 1.21), _cell("a", 0.81), _cell("a", 1.0), _cell("a", 1.0, lo=float("nan"))])
    s = scores(table)
    assert s[0] == pytest.approx(math.log(1.21 / 1.1)) and s[1] == pytest.approx(math.log(0.9 / 0.81))
    assert s[2] == pytest.approx(math.log(1.0 / 1.1)) and math.isnan(s[3])


def test_the_margin_is_the_finite_sample_quantile_and_infinite_with_fewer_than_nine_scores():
    values = np.arange(1, 20) / 100.0  # 19 scores: the ceil(20 x 0.9) = 18th
    assert margin(values) == pytest.approx(0.18)
    assert margin(values[:9]) == pytest.approx(0.09)  # ceil(10 x 0.9) = 9 of 9: the largest, still valid
    assert margin(values[:8]) == math.inf  # ceil(9 x 0.9) = 9 > 8: no finite margin holds 90%
    assert margin(np.array([np.nan] * 20)) == math.inf and margin(-values) == 0.0
    assert fewest_cells(0.9) == 9 and fewest_cells(0.8) == 4 and rank(19) == 18


def test_too_few_cells_widen_to_infinity_and_are_never_counted_as_covered():
    rows = [_cell(w, 1.0, metric=m) for w in ("a", "b", "c") for m in ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s")]
    out = leave_one_class_out(pd.DataFrame(rows))
    assert (out["calibration_cells"] == 6).all() and np.isinf(out["conformal_margin"]).all()
    assert out["in_interval_conformal"].isna().all()
    per_group = margins(pd.DataFrame(rows))
    assert per_group.loc[0, "calibration_cells"] == 9 and per_group.loc[0, "conformal_margin"] == 0.0


def test_an_outlying_class_widens_the_others_but_never_its_own_interval():
    metrics = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s")
    rows = [_cell("a", 1.32, metric=m) for m in metrics]  # a misses by 20% (log 0.182 above hi)
    rows += [_cell(w, 1.0, metric=m) for w in ("b", "c", "d", "e") for m in metrics]
    out = leave_one_class_out(pd.DataFrame(rows)).set_index(["workload", "metric"])
    assert out.loc[("a", "ttft_p50_s"), "conformal_margin"] == 0.0  # b-e are inside
    assert out.loc[("a", "ttft_p50_s"), "calibration_cells"] == 12
    assert not out.loc[("a", "ttft_p50_s"), "in_interval_conformal"]
    # b's 12 calibration cells hold a's 3 misses: its margin is the 11th smallest, one of a's
    assert out.loc[("b", "ttft_p50_s"), "conformal_margin"] == pytest.approx(math.log(1.32 / 1.1))
    assert out.loc[("b", "ttft_p50_s"), "sim_hi_conformal"] == pytest.approx(1.32)


def test_each_model_gpu_and_load_is_calibrated_apart():
    rows = []
    for model, hardware, load, engine in (("x", "h", "0.5", 1.3), ("x", "h", "0.8", 1.0), ("x", "g", "0.5", 1.0),
                                          ("y", "h", "0.5", 1.0)):
        rows += [_cell(f"c{i}", engine, model=model, hardware=hardware, load=load) for i in range(12)]
    out = leave_one_class_out(pd.DataFrame(rows))
    wide = (out["model"] == "x") & (out["hardware"] == "h") & (out["load"] == "0.5")
    assert np.allclose(out.loc[wide, "conformal_margin"], math.log(1.3 / 1.1))
    assert (out.loc[~wide, "conformal_margin"] == 0).all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), classes=st.lists(st.integers(2, 12), min_size=1, max_size=3),
       per_class=st.integers(1, 5), change=st.floats(0.2, 5.0))
def test_a_cell_never_calibrates_its_own_interval(seed, classes, per_class, change):
    """Moving every engine value of one class of one group, however far, leaves that class's margins
    as they were: neither a cell nor its class's other cells calibrate its interval."""
    rng = np.random.default_rng(seed)
    rows = [_cell(f"c{c}", float(np.exp(rng.normal(0, 0.1))), load=str(g), metric=f"m{k}")
            for g, n in enumerate(classes) for c in range(n) for k in range(per_class)]
    table = pd.DataFrame(rows)
    held = (table["load"] == "0") & (table["workload"] == "c0")
    moved = table.assign(engine=table["engine"].where(~held, table["engine"] * change))
    before, after = leave_one_class_out(table), leave_one_class_out(moved)
    assert before.loc[held, "conformal_margin"].equals(after.loc[held, "conformal_margin"])
    assert (before.loc[held, "calibration_cells"] == per_class * (classes[0] - 1)).all()


def _synthetic(rng: np.random.Generator, spreads: list[float], classes: int, per_class: int, replicates: int):
    """replicates x groups of exchangeable cells: each group's log errors i.i.d. normal with its own
    spread (heteroscedastic across groups, as loads are), intervals [0.95, 1.05] around the point."""
    n = classes * per_class
    rows = {"model": [], "hardware": [], "workload": [], "load": [], "engine": []}
    for r in range(replicates):
        for g, spread in enumerate(spreads):
            rows["model"] += [f"r{r}"] * n
            rows["hardware"] += ["h"] * n
            rows["load"] += [str(g)] * n
            rows["workload"] += [f"c{c}" for c in range(classes) for _ in range(per_class)]
            rows["engine"] += list(np.exp(rng.normal(0.0, spread, n)))
    return pd.DataFrame(rows).assign(metric="m", sim=1.0, sim_lo=0.95, sim_hi=1.05)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), spreads=st.lists(st.floats(0.01, 0.5), min_size=1, max_size=3),
       classes=st.integers(4, 10), per_class=st.integers(1, 6))
def test_every_group_is_covered_at_least_as_asked_on_exchangeable_cells(seed, spreads, classes, per_class):
    """Per group, averaged over 300 replicates, the widened intervals hold at least 90% of cells
    (less 0.03, over four standard errors), and at most 90% + 1 / (K + 1) where the margin is
    not held at 0; groups with fewer than 9 calibration cells are flagged, none counted."""
    rng = np.random.default_rng(seed)
    out = leave_one_class_out(_synthetic(rng, spreads, classes, per_class, replicates=300))
    k = (classes - 1) * per_class
    if k < 9:
        assert out["in_interval_conformal"].isna().all() and np.isinf(out["conformal_margin"]).all()
        return
    covered = out["in_interval_conformal"].astype(float).groupby(out["load"]).mean()
    raw = ((out["engine"] >= 0.95) & (out["engine"] <= 1.05)).groupby(out["load"]).mean()
    for load, share in covered.items():
        assert share >= 0.9 - 0.03, (load, share)
        if raw[load] < 0.5:  # a margin held at 0 would only add coverage
            assert share <= 0.9 + 1 / (k + 1) + 0.03, (load, share)
