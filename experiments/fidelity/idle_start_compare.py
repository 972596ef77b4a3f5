"""Two held-out tables side by side on one GPU's target cells (TTFT and TPOT P50/P90 at 50 and 80%
load): each cell's error before and after, how many are within target (own fit 10%, carried 15%)
and each load group's interval coverage (propagated and conformal, harness.fidelity.report.
coverage_table). For a model change priced on some rows of the table (idle_start_h200/README.md).

    python -m experiments.fidelity.idle_start_compare BEFORE.csv.gz AFTER.csv --hardware H200-SXM-141GB \
        --out experiments/fidelity/idle_start_h200

Writes OUT/cells.csv (a row per target cell and cost model) and OUT/groups.csv (per cost model and
load: cells within target; per load: coverage), and prints both as markdown.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from harness.fidelity.report import PLOTTED, coverage_table
from harness.scripting import one_line_errors

LOADS = ("0.5", "0.8")
BOUNDS = {"profiled": 0.10, "carried": 0.15}  # issue 35: own fit 10%, the H100 fit carried 15%
KEYS = ["model", "workload", "load", "metric", "cost_model"]
SIDES = ("before", "after")


def target_cells(table: pd.DataFrame, hardware: str) -> pd.DataFrame:
    keep = ((table["hardware"] == hardware) & table["metric"].isin(PLOTTED) & table["load"].isin(LOADS)
            & table["cost_model"].isin(BOUNDS))
    return table.loc[keep, KEYS + ["engine", "sim", "err", "in_interval"]].set_index(KEYS)


def cells(before: pd.DataFrame, after: pd.DataFrame, hardware: str) -> pd.DataFrame:
    old, new = target_cells(before, hardware), target_cells(after, hardware)
    if set(old.index) != set(new.index):
        raise ValueError(f"the tables' {hardware} target cells differ: {len(old)} before, {len(new)} after")
    new = new.loc[old.index]
    if not (old["engine"] == new["engine"]).all():
        raise ValueError("the engine side moved between the tables: compare the same calls")
    out = pd.DataFrame({"engine": old["engine"], "err_before": old["err"], "err_after": new["err"],
                        "in_interval_before": old["in_interval"], "in_interval_after": new["in_interval"]})
    bound = out.index.get_level_values("cost_model").map(BOUNDS).to_numpy(dtype=float)
    for side in SIDES:
        out[f"within_{side}"] = out[f"err_{side}"].abs() <= bound
    return out.reset_index()


def groups(compared: pd.DataFrame, before: pd.DataFrame, after: pd.DataFrame, hardware: str) -> pd.DataFrame:
    """Per model, cost model and load: cells within target before and after, and (profiled) the
    load group's coverage over its interval cells (every latency metric, as coverage.csv counts)."""
    rows = []
    for (model, cost_model, load), part in compared.groupby(["model", "cost_model", "load"]):
        row = {"model": model, "cost_model": cost_model, "load": load, "cells": len(part),
               "bound": BOUNDS[cost_model]}
        row.update({f"within_{side}": int(part[f"within_{side}"].sum()) for side in SIDES})
        if cost_model == "profiled":
            for side, table in zip(SIDES, (before, after)):
                coverage = coverage_table(table)
                group = coverage[(coverage["model"] == model) & (coverage["hardware"] == hardware)
                                 & (coverage["load"].astype(str) == load)].iloc[0]
                row[f"coverage_{side}"] = round(float(group["in_interval"]), 4)
                row[f"conformal_{side}"] = round(float(group["in_interval_conformal"]), 4)
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join("" if pd.isna(v) else (f"{v:+.1%}" if isinstance(v, float) and abs(v) < 1 and
                                                       c.startswith("err") else str(v))
                                for c, v in zip(table.columns, row)) + " |"
              for row in table.itertuples(index=False)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="the committed held-out table")
    parser.add_argument("after", type=Path, help="the table with the change priced (merge.py's heldout.csv)")
    parser.add_argument("--hardware", required=True, help="the cells' GPU, as the table names it")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    def run() -> int:
        before, after = (pd.read_csv(p, dtype={"load": str}) for p in (args.before, args.after))
        compared = cells(before, after, args.hardware)
        summary = groups(compared, before, after, args.hardware)
        args.out.mkdir(parents=True, exist_ok=True)
        compared.round(6).to_csv(args.out / "cells.csv", index=False)
        summary.to_csv(args.out / "groups.csv", index=False)
        print(markdown(compared.drop(columns=["model", "engine"])))
        print()
        print(markdown(summary))
        return 0

    return int(one_line_errors(run))


if __name__ == "__main__":
    sys.exit(main())
