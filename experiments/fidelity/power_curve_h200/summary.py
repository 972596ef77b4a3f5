"""cells.sh's tables side by side: each sample's loaded cells (TTFT and TPOT P50 / P90 at 50, 80 and
95% load) and its drain's throughput, without and with the power curve; how many loaded cells are
within 10% each way. No GPU needed.

    python -m experiments.fidelity.power_curve_h200.summary /tmp/power_cells --out summary.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
BOUND = 0.10


def errors(folder: Path) -> pd.DataFrame:
    """sample, side, load, metric, err (%) of every *_without.csv / *_with.csv in folder."""
    rows = []
    for path in sorted(folder.glob("*_with*.csv")):
        sample, side = path.stem.rsplit("_", 1)
        table = pd.read_csv(path)
        loaded = table[table["metric"].isin(METRICS) & (table["load"].astype(str) != "offline")]
        drain = table[(table["metric"] == "request_s") & (table["load"].astype(str) == "offline")]
        for part in (loaded, drain):
            for _, row in part.iterrows():
                rows.append({"sample": sample, "side": side, "load": str(row["load"]), "metric": row["metric"],
                             "err": round(100 * float(row["err"]), 1)})
    if not rows:
        raise ValueError(f"{folder}: no *_without.csv / *_with.csv tables (cells.sh writes them)")
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        table = errors(args.folder)
    except (OSError, KeyError, ValueError) as error:
        print(f"summary: {error}", file=sys.stderr)
        return 1
    table.to_csv(args.out, index=False)
    wide = table.pivot_table(index=["sample", "load"], columns=["metric", "side"], values="err")
    print(wide.round(1).to_string())
    loaded = table[table["metric"].isin(METRICS)]
    by_side = (loaded["err"].abs() <= 100 * BOUND).groupby([loaded["sample"], loaded["side"]])
    inside = by_side.sum().unstack().assign(cells=by_side.size().unstack()["with"])
    print(f"\nloaded cells within {BOUND:.0%}:")
    print(inside.to_string())
    print(f"all samples: {int(inside['without'].sum())} -> {int(inside['with'].sum())} of {int(inside['cells'].sum())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
