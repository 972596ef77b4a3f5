"""Why a model-and-load group of the held-out table misses its 90% coverage: per group, how the
raw errors and the conformal scores (harness.fidelity.conformal) spread, and which classes the
cells outside their conformalised interval belong to. No GPU needed.

    python experiments/fidelity/coverage_misses.py experiments/fidelity/heldout.csv.gz

Writes nothing; prints two tables: per group the |ln(sim / engine)| median and 90th percentile
beside the interval's log half-width and the scores' 90th percentile (a score grows with load only
if the errors outgrow the propagated interval), then per group and class the cells outside.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from harness.fidelity.conformal import GROUP, leave_one_class_out, scores
from harness.fidelity.report import LOAD_METRICS
from harness.scripting import one_line_errors


def spreads(cells: pd.DataFrame) -> pd.DataFrame:
    """Per group: cells, classes, |log error| median and P90, interval log half-width median, score P90."""
    cells = cells.assign(abs_log_err=np.abs(np.log(cells["sim"] / cells["engine"])),
                         log_half_width=np.log(cells["sim_hi"] / cells["sim_lo"]) / 2, score=scores(cells))
    return cells.groupby(GROUP).agg(cells=("score", "size"), classes=("workload", "nunique"),
                                    abs_log_err_p50=("abs_log_err", "median"),
                                    abs_log_err_p90=("abs_log_err", lambda s: s.quantile(0.9)),
                                    log_half_width_p50=("log_half_width", "median"),
                                    score_p90=("score", lambda s: s.quantile(0.9)))


def misses(cells: pd.DataFrame) -> pd.DataFrame:
    """Per group and class: cells outside the conformalised interval (groups with too few cells left out)."""
    out = leave_one_class_out(cells)
    claimed = out[out["in_interval_conformal"].notna()]
    outside = ~claimed["in_interval_conformal"].astype(bool)
    return (claimed.assign(outside=outside).groupby([*GROUP, "workload"])
            .agg(cells=("outside", "size"), outside=("outside", "sum"), margin=("conformal_margin", "first"))
            .query("outside > 0"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="the merged heldout.csv")
    args = parser.parse_args(argv)

    def run() -> int:
        table = pd.read_csv(args.table, dtype={"load": str})
        cells = table[(table["cost_model"] == "profiled") & table["metric"].isin(LOAD_METRICS)
                      & table["in_interval"].notna()]
        pd.set_option("display.width", 200)
        print(spreads(cells).round(3).to_string())
        print()
        print(misses(cells).round(3).to_string())
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
