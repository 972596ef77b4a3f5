"""Merge the held-out tables of the GPU calls (run_gpu.sh) into experiments/fidelity/heldout.csv,
with heldout_<model>.png per model, coverage.csv and targets.csv (cells within 10%). No GPU needed.

    python experiments/fidelity/merge.py experiments/fidelity/calls/*/heldout.csv

A later table's rows replace an earlier one's for the same model, hardware, class, load, metric
and cost model, so a call that re-measures some classes updates the committed table in place:

    python experiments/fidelity/merge.py experiments/fidelity/heldout.csv <the call's heldout.csv>
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from harness.fidelity_report import coverage_table, merge, plot_heldout, target_table

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", type=Path, help="heldout.csv of each call")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    table = merge([pd.read_csv(path) for path in args.tables])
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "heldout.csv", index=False)
    for (model, hardware), part in table.groupby(["model", "hardware"]):
        plot_heldout(part, args.out / f"heldout_{model}_{hardware}.png")
    target_table(table).to_csv(args.out / "targets.csv", index=False)
    coverage = coverage_table(table)
    coverage.to_csv(args.out / "coverage.csv", index=False)
    print(coverage.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
