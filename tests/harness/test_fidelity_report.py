"""The held-out table's target counts: cells within 10% per model, workload and cost model."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.fidelity_report import coverage_table, merge, target_table


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
    committed = pd.read_csv(Path(__file__).resolve().parents[2] / "experiments" / "fidelity" / "heldout.csv")
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
