"""The held-out table's target counts: cells within 10% per model, workload and cost model."""

from __future__ import annotations

import pandas as pd

from harness.fidelity_report import target_table


def test_target_table_counts_only_the_targeted_metrics_and_loads():
    rows = []
    for load, err in (("0.5", 0.05), ("0.8", -0.2), ("0.95", 0.0), ("offline", 0.0)):
        for metric in ("ttft_p50_s", "tpot_p90_s", "e2e_p50_s"):
            rows.append({"model": "m", "workload": "w", "cost_model": "profiled", "load": load,
                         "metric": metric, "err": err})
    rows.append({"model": "m", "workload": "w", "cost_model": "profiled", "load": "0.5", "metric": "ttft_p90_s",
                 "err": 0.1})  # on the bound: within
    table = target_table(pd.DataFrame(rows))
    assert table.to_dict("records") == [
        {"model": "m", "workload": "w", "cost_model": "profiled", "within_10pct": 3, "cells": 5}]
