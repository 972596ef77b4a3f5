"""Two resimulate_all.sh folders side by side: each cell's relative error before and after, and
the largest change of any prediction. No GPU needed.

    python experiments/fidelity/cause/diff_cells.py /tmp/before /tmp/after
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "request_s")
KEYS = ["model", "hardware", "workload", "load", "metric"]
TARGET_METRICS = METRICS[:4]  # issue 35's: TTFT and TPOT P50/P90 at each load
TARGET_LOADS = ("0.5", "0.8", "0.95")
CARRIED_BOUND = 0.15  # a fit carried to another GPU (issue 35); every other fit: --bound


def within(both: pd.DataFrame, group: str, bound: float) -> str:
    """The group's target cells within their bound, before and after, and their mean |err|. The
    table-wide groups leave out code_completion, which the cc_* groups price at each run's host."""
    cells = both[both["metric"].isin(TARGET_METRICS) & both["load"].astype(str).isin(TARGET_LOADS)]
    if not group.startswith("cc_"):
        cells = cells[cells["workload"] != "code_completion"]
    limit = CARRIED_BOUND if "carried" in group else bound
    counts = [int((cells[f"err_{side}"].abs() <= limit).sum()) for side in ("before", "after")]
    means = [100 * cells[f"err_{side}"].abs().mean() for side in ("before", "after")]
    return (f"  within {100 * limit:.0f}%: {counts[0]} -> {counts[1]} of {len(cells)} target cells "
            f"(mean |err| {means[0]:.2f}% -> {means[1]:.2f}%)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="resimulate_all.sh's folder before a model change")
    parser.add_argument("after", type=Path, help="its folder after the change")
    parser.add_argument("--bound", type=float, default=0.10, help="the target of a fit not carried (default 10%%)")
    args = parser.parse_args(argv)
    before, after = args.before, args.after
    for path in sorted(before.glob("*.csv")):
        old = pd.read_csv(path)
        new = pd.read_csv(after / path.name)
        both = old.merge(new, on=KEYS, suffixes=("_before", "_after"))
        both = both[both["metric"].isin(METRICS)]
        change = ((both["sim_after"] - both["sim_before"]) / both["sim_before"]).abs().max()
        print(f"{path.stem}: largest relative change of a prediction {change:.2e}")
        print(within(both, path.stem, args.bound))
        if change > 1e-12:
            table = both.pivot_table(index=["workload", "load"], columns="metric", values=["err_before", "err_after"])
            print((100 * table).round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
