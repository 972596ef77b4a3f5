"""Per model-and-load group, the conformal coverage and the median width of the interval in each
of several held-out tables: the tables interval_seeds.sh merges for each seed of the interval's
draws, or any heldout.csv (the committed one). No GPU needed.

    python experiments/fidelity/interval_seeds_summary.py s1=/tmp/seeds/s1/table/heldout.csv ...
        --model qwen3-8b --out experiments/fidelity/interval_seeds.csv [--append]

Each table's profiled cells (the coverage's: cost_model profiled, the load metrics, an interval)
are conformalised as merge.py does (harness.fidelity.conformal.leave_one_class_out); per group:
the cells with a coverage claim, how many lie inside, the conformal and the propagated coverage,
and the median width ln(hi / lo) of the conformalised and of the propagated interval. Prints the
cells inside per table and group, and per group the least, mean and most coverage over the tables.
With --append the rows --out holds already stay, but those of a table label and model written now
(one CSV for several models' seeds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from harness.convert import ConfigError
from harness.fidelity.conformal import GROUP, leave_one_class_out
from harness.fidelity.report import LOAD_METRICS
from harness.scripting import one_line_errors


def group_summary(table: pd.DataFrame, model: str | None) -> pd.DataFrame:
    """Per group of the table's profiled cells (of one model, or all): cells claimed, inside,
    coverage (conformal, propagated) and median widths ln(hi / lo) (conformalised, propagated)."""
    cells = table[(table["cost_model"] == "profiled") & table["metric"].isin(LOAD_METRICS)
                  & table["in_interval"].notna()]
    if model is not None:
        cells = cells[cells["model"] == model]
    if cells.empty:
        raise ConfigError(f"the table has no profiled cells with an interval{f' of {model}' if model else ''}")
    out = leave_one_class_out(cells)
    out = out.assign(width=np.log(out["sim_hi_conformal"] / out["sim_lo_conformal"]),
                     width_propagated=np.log(out["sim_hi"] / out["sim_lo"]),
                     propagated=out["in_interval"].astype(bool))
    claimed = out[out["in_interval_conformal"].notna()]
    return claimed.groupby(GROUP).agg(
        cells=("propagated", "size"), inside=("in_interval_conformal", lambda s: int(s.astype(bool).sum())),
        coverage=("in_interval_conformal", lambda s: float(s.astype(bool).mean())),
        propagated=("propagated", "mean"), width_p50=("width", "median"),
        width_propagated_p50=("width_propagated", "median")).reset_index()


def summarise(tables: dict[str, Path], model: str | None) -> pd.DataFrame:
    parts = []
    for label, path in tables.items():
        if not path.exists():
            raise ConfigError(f"{label}: no table at {path}")
        parts.append(group_summary(pd.read_csv(path, dtype={"load": str}), model).assign(table=label))
    return pd.concat(parts, ignore_index=True)[["table", *GROUP, "cells", "inside", "coverage", "propagated",
                                                "width_p50", "width_propagated_p50"]]


def appended(summary: pd.DataFrame, existing: pd.DataFrame) -> pd.DataFrame:
    """The existing rows, less those of a table label and model the summary has, then the summary's."""
    new = pd.MultiIndex.from_frame(summary[["table", "model"]])
    kept = existing[~pd.MultiIndex.from_frame(existing[["table", "model"]]).isin(new)]
    return pd.concat([kept, summary], ignore_index=True)


def _labelled(entry: str) -> tuple[str, Path]:
    label, sep, path = entry.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=PATH, got {entry!r}")
    return label, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", type=_labelled, nargs="+", help="LABEL=PATH of a merged heldout.csv(.gz)")
    parser.add_argument("--model", default=None, help="only this model's groups (default: every model)")
    parser.add_argument("--out", type=Path, default=None, help="write the per-table, per-group rows here (CSV)")
    parser.add_argument("--append", action="store_true",
                        help="keep --out's rows of other table labels or models (default: --out is replaced)")
    args = parser.parse_args(argv)
    if args.append and args.out is None:
        parser.error("--append needs --out")

    def run() -> int:
        summary = summarise(dict(args.tables), args.model)
        if args.out is not None:
            rows = summary.round(4)
            if args.append and args.out.exists():
                rows = appended(rows, pd.read_csv(args.out, dtype={"load": str}))
            rows.to_csv(args.out, index=False)
        pd.set_option("display.width", 200)
        print(summary.pivot_table(index="table", columns=[*GROUP], values="inside", sort=False).to_string())
        percent = summary.assign(coverage=100 * summary["coverage"])
        print(percent.groupby(GROUP)[["coverage", "width_p50"]].agg(["min", "mean", "max"]).round(3).to_string())
        return 0

    return int(one_line_errors(run))


if __name__ == "__main__":
    sys.exit(main())
