"""The table of h200_fit_choice.sh: per committed comparison priced with the H200 Qwen3-0.6B
profile, how many of its cells are within target with the old fit and with the new one (both
re-simulated with today's model). Writes SCRATCH/h200_fit_choice.csv (or --out) and prints it as
markdown.

    python experiments/fidelity/h200_fit_choice.py /tmp/fits [--out experiments/fidelity/h200_fit_choice.csv]

Targets: the held-out table's (TTFT and TPOT P50/P90 at 50 and 80% load within 10%,
harness.fidelity.report.target_table), the fleet's (the same four within 10%, compare_fleet.py),
the mid-run check's (TTFT P90 per 10 s window within 15%, midrun_rerun.py) and the disaggregated
calls' (experiments.disagg.tables.TARGETS, every metric of both fleets, as resim prints them).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from harness.fidelity.report import target_table

FITS = ("old", "new")
WITHIN = re.compile(r"^(\d+) of (\d+) comparisons within target", re.MULTILINE)
Count = tuple[int, int] | None  # (within, cells); None: not priced with that fit


def heldout_cells(path: Path) -> Count:
    if not path.is_file():
        return None
    table = pd.read_csv(path, dtype={"load": str})
    cells = target_table(table[table["cost_model"] == "profiled"])
    return int(cells["within_10pct"].sum()), int(cells["cells"].sum())


def fleet_cells(folder: Path) -> Count:
    path = folder / "fleet_compare.csv"
    if not path.is_file():
        return None
    table = pd.read_csv(path)
    return int(table["within_10pct"].sum()), len(table)


def midrun_windows(folder: Path) -> Count:
    path = folder / "midrun_rerun.csv"
    if not path.is_file():
        return None
    row = pd.read_csv(path).query("pricing == 'as_run'").iloc[0]
    return int(row["windows_within_15pct"]), int(row["windows_scored"])


def disagg_comparisons(log: Path) -> Count:
    if not log.is_file():
        return None
    match = WITHIN.search(log.read_text())
    if match is None:
        raise ValueError(f"{log}: no 'N of M comparisons within target' line (did resim finish?)")
    return int(match.group(1)), int(match.group(2))


Comparison = tuple[str, str, Callable[[Path], Count], str]


def comparisons(scratch: Path) -> list[Comparison]:
    """(comparison, target, counter, its file or folder under a fit's folder) for each comparison."""
    rows: list[Comparison] = [
        ("held-out table, H200 cells (3 classes, conversation pooled over 2 calls)", "10%", heldout_cells,
         "heldout_h200/heldout.csv"),
        ("code_completion H200, second call, grid's host", "10%", heldout_cells, "cc2_grid_host.csv"),
        ("code_completion H200, second call, each run's measured host", "10%", heldout_cells, "cc2_run_host.csv"),
        ("code_completion H200, first call, grid's host", "10%", heldout_cells, "cc1_grid_host.csv"),
        ("two-replica fleet (fleet/h200x2_run2)", "10%", fleet_cells, "fleet"),
    ]
    rows += [(f"mid-run start, autoscale/h200_run{run}", "15% a window", midrun_windows, f"midrun/run{run}")
             for run in (1, 2, 3)]
    rows += [(f"disaggregated, {log.stem}", "tables.TARGETS", disagg_comparisons, f"disagg/{log.name}")
             for log in sorted((scratch / FITS[0] / "disagg").glob("*.log"))]
    return rows


def table(scratch: Path) -> pd.DataFrame:
    out = []
    for name, target, count, where in comparisons(scratch):
        row: dict[str, object] = {"comparison": name, "target": target}
        for fit in FITS:
            counted = count(scratch / fit / where)
            row[f"within_{fit}"], row["cells"] = (counted if counted else (None, row.get("cells")))
        out.append(row)
    columns = [f"within_{fit}" for fit in FITS]
    return pd.DataFrame(out)[["comparison", "target", "cells", *columns]].astype({c: "Int64" for c in columns})


def markdown(result: pd.DataFrame) -> str:
    def cell(value: object) -> str:
        return "-" if pd.isna(value) else str(value)

    lines = ["| " + " | ".join(result.columns) + " |", "|" + "---|" * len(result.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in result.itertuples(index=False)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scratch", type=Path, help="h200_fit_choice.sh's scratch folder (old/ and new/)")
    parser.add_argument("--out", type=Path, default=None, help="the CSV (default: SCRATCH/h200_fit_choice.csv)")
    args = parser.parse_args(argv)
    missing = [fit for fit in FITS if not (args.scratch / fit).is_dir()]
    if missing:
        print(f"error: {args.scratch} has no {', '.join(missing)}/ (run h200_fit_choice.sh first)", file=sys.stderr)
        return 2
    result = table(args.scratch)
    result.to_csv(args.out or args.scratch / "h200_fit_choice.csv", index=False)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
