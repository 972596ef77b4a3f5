"""Measure calls' cells against the simulated fleet's 90% prediction intervals (issue 32; the
intervals: harness.fidelity.fleet_interval, a pool's machines drawn together).

    python -m experiments.disagg.intervals CALL [CALL ...] --out DIR [--draws 19]

Each CALL is a `run_disagg measure` folder (runs.csv or runs.csv.gz, settings.json). Its cells are
re-simulated with their intervals by h200_run1/resim.py (--aggregated --interval DRAWS; a CSV
already in DIR/resim/ is read, not run again: about 8 minutes a call on one core). Writes
DIR/intervals.csv, one row per cell and latency (TTFT and TPOT P50/P90): the measured figure, the
point prediction and its error, the interval and whether the measured figure lies in it; and
DIR/intervals_summary.csv, per model, fleet kind and load: how many of those figures the point
holds within 10% (the issue's target) and how many the interval holds, and the interval's median
relative width (hi - lo) / point. The point answers "what will it be", the interval "how sure":
near saturation a small price error moves a latency many times over, and the interval says so.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from experiments.disagg.h200_run1 import resim
from experiments.disagg.tables import TARGETS, runs_path
from sim.interval import INTERVAL_METRICS

LATENCIES = tuple(m for m in INTERVAL_METRICS if m.startswith(("ttft", "tpot")))
KEYS = ["fleet", "workload", "load"]


def resimulated(call: Path, out: Path, draws: int) -> pd.DataFrame:
    """The call's cells re-simulated with intervals (resim.py), run once and kept in out."""
    path = out / "resim" / f"{'_'.join(call.parts[-2:])}.csv"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        resim.main(["--run", str(call), "--aggregated", "--interval", str(draws), "--out", str(path)])
    return pd.read_csv(path, dtype={"load": str})


def cell_rows(call: Path, simulated: pd.DataFrame) -> pd.DataFrame:
    """One row per cell and latency: measured, point, its error, the interval, inside or not."""
    runs = pd.read_csv(runs_path(call), dtype={"load": str})
    measured = runs[runs.side == "measured"].set_index(KEYS)
    model = json.loads((call / "settings.json").read_text())["args"].get("model", "qwen3-0.6b")
    rows = []
    for _, cell in simulated.iterrows():
        key = tuple(cell[k] for k in KEYS)
        for metric in LATENCIES:
            value, point = float(measured.loc[key, metric]), float(cell[metric])
            lo, hi = float(cell[f"{metric}_lo"]), float(cell[f"{metric}_hi"])
            rows.append({"call": str(call), "model": model, **dict(zip(KEYS, key)),
                         "kind": "disaggregated" if re.fullmatch(r"\d+P\d+D", key[0]) else "aggregated",
                         "metric": metric, "measured": value, "point": point, "err": point / value - 1,
                         "lo": lo, "hi": hi, "inside": lo <= value <= hi, "width": (hi - lo) / point})
    return pd.DataFrame(rows)


def summary(cells: pd.DataFrame) -> pd.DataFrame:
    """Per model, fleet kind and load, and over all: the point within target, inside the interval."""
    cells = cells.assign(within=cells["err"].abs() <= cells["metric"].map(TARGETS))

    def count(group: pd.DataFrame) -> pd.Series:
        return pd.Series({"figures": len(group), "point_within_target": int(group["within"].sum()),
                          "inside_interval": int(group["inside"].sum()),
                          "coverage": group["inside"].mean(), "median_width": group["width"].median()})

    groups = cells.groupby(["model", "kind", "load"]).apply(count, include_groups=False).reset_index()
    total = count(cells).to_frame().T.assign(model="all", kind="all", load="all")
    return pd.concat([groups, total], ignore_index=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("calls", nargs="+", type=Path, help="run_disagg measure folders")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--draws", type=int, default=19, help="perturbed runs per cell (the interval's default)")
    args = parser.parse_args(argv)
    missing = [str(c) for c in args.calls if not (c / "settings.json").is_file()]
    if missing:
        raise SystemExit(f"not a measure call's folder (no settings.json): {', '.join(missing)}")
    frames = [cell_rows(call, resimulated(call, args.out, args.draws)) for call in tqdm(args.calls, unit="call")]
    cells = pd.concat(frames, ignore_index=True)
    cells.to_csv(args.out / "intervals.csv", index=False)
    table = summary(cells)
    table.to_csv(args.out / "intervals_summary.csv", index=False)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"wrote {args.out / 'intervals.csv'} and {args.out / 'intervals_summary.csv'}")


if __name__ == "__main__":
    main()
