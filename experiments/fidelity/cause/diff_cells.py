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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="resimulate_all.sh's folder before a model change")
    parser.add_argument("after", type=Path, help="its folder after the change")
    args = parser.parse_args(argv)
    before, after = args.before, args.after
    for path in sorted(before.glob("*.csv")):
        old = pd.read_csv(path)
        new = pd.read_csv(after / path.name)
        both = old.merge(new, on=KEYS, suffixes=("_before", "_after"))
        both = both[both["metric"].isin(METRICS)]
        change = ((both["sim_after"] - both["sim_before"]) / both["sim_before"]).abs().max()
        print(f"{path.stem}: largest relative change of a prediction {change:.2e}")
        if change > 1e-12:
            table = both.pivot_table(index=["workload", "load"], columns="metric", values=["err_before", "err_after"])
            print((100 * table).round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
