"""The held-out table's target counts (cells within 10% per model, workload and cost model), its
merge, and the offline schedule comparison (schedules.csv) with its merge."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from harness.convert import ConfigError
from harness.fidelity.report import coverage_table, merge, pool, target_table
from harness.fidelity.schedules import COLUMNS as SCHEDULE_COLUMNS
from harness.fidelity.schedules import merge_schedules, schedule_rows, schedules_frame


def test_target_table_counts_only_the_targeted_metrics_and_loads():
    rows = []
    for load, err in (("0.5", 0.05), ("0.8", -0.2), ("0.95", 0.0), ("offline", 0.0)):
        for metric in ("ttft_p50_s", "tpot_p90_s", "e2e_p50_s"):
            rows.append({"model": "m", "hardware": "h", "workload": "w", "cost_model": "profiled", "load": load,
                         "metric": metric, "err": err})
    rows.append({"model": "m", "hardware": "h", "workload": "w", "cost_model": "profiled", "load": "0.5",
                 "metric": "ttft_p90_s",
                 "err": 0.1})  # on the bound: within
    table = target_table(pd.DataFrame(rows))
    assert table.to_dict("records") == [
        {"model": "m", "hardware": "h", "workload": "w", "cost_model": "profiled", "within_10pct": 3, "cells": 5}]


def test_merge_replaces_a_class_of_the_committed_table_with_a_later_calls_rows(tmp_path):
    """merge.py with the committed heldout.csv first and a new call's table after it: the new
    call's cells replace the committed ones of the same model, class, load, metric and cost
    model; every other cell stays (the read-back CSVs keep load as text, so "0.5" meets "0.5")."""
    committed = pd.read_csv(Path(__file__).resolve().parents[2] / "experiments" / "fidelity" / "heldout.csv.gz")
    new = committed[(committed["model"] == "qwen3-0.6b") & (committed["workload"] == "shared_prefix")].copy()
    new["sim"] = new["engine"]
    new["err"] = 0.0
    new.to_csv(tmp_path / "new.csv", index=False)
    committed.to_csv(tmp_path / "committed.csv", index=False)
    merged = merge([pd.read_csv(tmp_path / "committed.csv"), pd.read_csv(tmp_path / "new.csv")])
    assert len(merged) == len(committed)
    replaced = (merged["model"] == "qwen3-0.6b") & (merged["workload"] == "shared_prefix")
    assert replaced.sum() == len(new) and (merged.loc[replaced, "err"] == 0.0).all()
    others = committed[~((committed["model"] == "qwen3-0.6b") & (committed["workload"] == "shared_prefix"))]
    pd.testing.assert_frame_equal(merged[~replaced].reset_index(drop=True), others.reset_index(drop=True))


def _cell(engine: float, repeats: int, spread: float, sim: float = 1.0, metric: str = "ttft_p50_s") -> dict:
    return {"model": "m", "hardware": "h", "workload": "w", "load": "0.5", "metric": metric, "engine": engine,
            "sim": sim, "err": (sim - engine) / engine, "cost_model": "profiled", "engine_spread": spread,
            "sim_lo": 0.95, "sim_hi": 1.05, "in_interval": 0.95 <= engine <= 1.05, "rate_req_s": 3.0,
            "engine_repeats": repeats}


def test_pool_weighs_every_calls_repeats_and_says_how_far_the_machines_lie_apart():
    """A cell served by two calls (two machines): the engine is the mean over all repeats, err and
    in_interval are taken against it, the spread is the calls' means apart where that exceeds a
    call's own; a cell served once passes through as it was."""
    first = pd.DataFrame([_cell(0.90, 2, 0.01), _cell(2.0, 2, 0.03, sim=2.1, metric="tpot_p50_s")])
    second = pd.DataFrame([_cell(1.02, 4, 0.02, sim=1.03)])
    pooled = pool([first, second]).set_index("metric")
    cell = pooled.loc["ttft_p50_s"]
    assert cell["engine"] == pytest.approx((2 * 0.90 + 4 * 1.02) / 6)
    assert cell["sim"] == pytest.approx((2 * 1.0 + 4 * 1.03) / 6)  # each call simulated its own rates
    assert cell["engine_repeats"] == 6 and cell["engine_calls"] == 2
    assert cell["engine_spread"] == pytest.approx(0.12 / 0.96)  # the calls' means apart
    assert cell["err"] == pytest.approx((cell["sim"] - cell["engine"]) / cell["engine"])
    assert bool(cell["in_interval"]) is True  # 0.98 is inside, though the first call's 0.90 was not
    once = pooled.loc["tpot_p50_s"]
    assert (once["engine"], once["engine_spread"], once["engine_calls"]) == (2.0, 0.03, 1)
    assert len(pool([pooled.reset_index(), pd.DataFrame([_cell(1.0, 2, 0.5)])])) == 2
    assert pool([pooled.reset_index(), pd.DataFrame([_cell(1.0, 2, 0.5)])]).iloc[0]["engine_calls"] == 3


def test_coverage_pools_every_cell_with_an_interval_in_its_last_row():
    rows = [{"model": m, "hardware": "h", "workload": "w", "cost_model": c, "load": "0.5", "metric": "ttft_p50_s",
             "err": 0.0, "engine_spread": 0.0, "in_interval": inside}
            for m, c, inside in (("a", "profiled", True), ("a", "profiled", False), ("b", "profiled", True),
                                 ("b", "roofline", None), ("b", "profiled", None))]
    table = coverage_table(pd.DataFrame(rows))
    pooled = table.iloc[-1]
    assert (pooled["model"], pooled["load"], pooled["cells"]) == ("all", "all", 3)
    assert pooled["in_interval"] == pytest.approx(2 / 3)
    assert list(table["in_interval"][:-1]) == [0.5, 1.0]


def test_coverage_is_claimed_only_for_groups_with_enough_calibration_cells():
    """Per model, GPU and load: ten one-metric classes at 0.5 (nine calibration cells each, the
    fewest for 90%) and three at 0.8 (two each: too few, flagged, no share claimed)."""
    rows = [{"model": "m", "hardware": "h", "workload": f"c{i}", "cost_model": "profiled", "load": load,
             "metric": "ttft_p50_s", "engine": 1.0, "sim": 1.0, "sim_lo": 0.9, "sim_hi": 1.1, "err": 0.0,
             "engine_spread": 0.0, "in_interval": True} for load, n in (("0.5", 10), ("0.8", 3)) for i in range(n)]
    table = coverage_table(pd.DataFrame(rows)).set_index("load")
    assert table.loc["0.5", "in_interval_conformal"] == 1.0 and table.loc["0.5", "calibration_cells"] == 9
    assert table.loc["0.5", "too_few_cells"] == 0
    assert math.isnan(table.loc["0.8", "in_interval_conformal"]) and table.loc["0.8", "too_few_cells"] == 3
    assert table.loc["0.8", "calibration_cells"] == 2 and table.loc["all", "too_few_cells"] == 3


def _steps(hashes: str, preempted: str | None = None) -> pd.DataFrame:
    """A recorded step table of one letter per step's schedule hash."""
    flags = [int(c) for c in (preempted or "0" * len(hashes))]
    return pd.DataFrame({"schedule_hash": list(hashes), "preempted": flags,
                         "start": [0.1 * i for i in range(len(hashes))]})


def test_schedule_rows_say_where_each_run_parts_from_each_repeat_and_the_repeats_from_each_other():
    rc = SimpleNamespace(model=SimpleNamespace(name="m"), hardware=SimpleNamespace(name="h"))
    engine = [_steps("abcd", "0100"), _steps("abxd", "0100")]
    rows = schedule_rows(rc, "w", engine, {"profiled": _steps("abcd", "0100"), "roofline": _steps("abc", "011")})
    assert list(schedules_frame(rows).columns) == list(SCHEDULE_COLUMNS)
    table = schedules_frame(rows).set_index(["engine_repeat", "cost_model"])
    assert list(table.index) == [(0, "profiled"), (0, "roofline"), (1, "profiled"), (1, "roofline"),
                                 (1, "engine_repeat")]
    assert table.loc[(0, "profiled"), "schedule_identical"] and table.loc[(0, "profiled"), "first_divergent_step"] == -1
    # a prefix of the engine's schedule is not the schedule: it parts where it stops
    assert table.loc[(0, "roofline")][["schedule_identical", "first_divergent_step", "identical_steps", "sim_steps",
                                       "engine_preemptions", "sim_preemptions"]].tolist() == [False, 3, 3, 3, 1, 2]
    assert table.loc[(1, "profiled")][["schedule_identical", "first_divergent_step", "identical_steps"]].tolist() == [
        False, 2, 3]
    # the engine against itself: repeat 1 parts from repeat 0 at step 2
    assert table.loc[(1, "engine_repeat")][["schedule_identical", "first_divergent_step", "engine_steps"]].tolist() == [
        False, 2, 4]


def test_merged_schedules_keep_a_later_calls_row_and_reject_a_table_without_the_columns():
    row = {"model": "m", "hardware": "h", "workload": "w", "cost_model": "profiled", "engine_repeat": 0,
           "schedule_identical": True, "first_divergent_step": -1, "engine_steps": 4, "sim_steps": 4,
           "identical_steps": 4, "engine_preemptions": 0, "sim_preemptions": 0}
    earlier = pd.DataFrame([row, {**row, "engine_repeat": 1}])
    later = pd.DataFrame([{**row, "schedule_identical": False, "first_divergent_step": 2}])
    merged = merge_schedules([earlier, later]).set_index("engine_repeat")
    assert len(merged) == 2 and not merged.loc[0, "schedule_identical"] and merged.loc[1, "schedule_identical"]
    with pytest.raises(ConfigError, match=r"schedules.csv: missing column\(s\) \['engine_repeat'\]"):
        merge_schedules([earlier, later.drop(columns=["engine_repeat"])])


def test_merge_script_merges_the_schedules_beside_the_tables(tmp_path, capsys):
    """merge.py finds schedules.csv beside each heldout.csv (a call without one is merged as
    before); an offline-only model gets no plot."""
    from experiments.fidelity.merge import main

    committed = pd.read_csv(Path(__file__).resolve().parents[2] / "experiments" / "fidelity" / "heldout.csv.gz")
    bursty = committed[(committed["model"] == "qwen3-0.6b") & (committed["workload"] == "bursty")]
    cell = bursty[bursty["hardware"] == bursty["hardware"].iloc[0]]
    offline_only = cell[cell["load"].astype(str) == "offline"].assign(model="offline-only")
    assert len(offline_only) and len(offline_only) < len(cell)
    row = {"model": "qwen3-0.6b", "hardware": cell["hardware"].iloc[0], "workload": "bursty", "cost_model": "roofline",
           "engine_repeat": 0, "schedule_identical": True, "first_divergent_step": -1, "engine_steps": 9,
           "sim_steps": 9, "identical_steps": 9, "engine_preemptions": 0, "sim_preemptions": 0}
    calls = [tmp_path / name for name in ("a", "b", "c")]
    beside = ([row, {**row, "engine_repeat": 1}], None, [{**row, "schedule_identical": False}])  # b: none
    for call, table, schedules in zip(calls, (cell, offline_only, cell), beside):
        call.mkdir()
        table.to_csv(call / "heldout.csv", index=False)
        if schedules is not None:
            pd.DataFrame(schedules).to_csv(call / "schedules.csv", index=False)
    assert main([*(str(c / "heldout.csv") for c in calls), "--out", str(tmp_path / "out")]) == 0
    merged = pd.read_csv(tmp_path / "out" / "schedules.csv").set_index("engine_repeat")
    assert len(merged) == 2 and not merged.loc[0, "schedule_identical"] and merged.loc[1, "schedule_identical"]
    assert "schedules: 1 of 2 offline comparisons identical" in capsys.readouterr().out
    plots = sorted(p.name for p in (tmp_path / "out").glob("heldout_*.png"))
    assert plots == [f"heldout_qwen3-0.6b_{row['hardware']}.png"]
    pd.DataFrame([row]).drop(columns=["sim_steps"]).to_csv(calls[0] / "schedules.csv", index=False)
    assert main([str(calls[0] / "heldout.csv"), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: schedules.csv: missing column(s) ['sim_steps']") and "\n" not in error
