"""How far a measure call's errors move when every step is priced a little dearer or cheaper: its cells
re-simulated (h200_run1/resim.py) with backend.device_scale at each given factor.

    python -m experiments.disagg.sensitivity CALL [CALL ...] --scales 0.988 1 1.006 1.012 1.024 --out DIR

A CSV already in DIR/resim/ is read, not run again (about 1.5 minutes a call and factor on one core).
Writes DIR/sensitivity.csv (per call, factor and disaggregated cell: TTFT and TPOT P50/P90 and
throughput error, %) and prints the TPOT P50 error per cell, calls by factors, with each cell's slope
(points of error per 1% of price, least squares over the factors). A cell whose slope is many points
per percent cannot be predicted within 10% by any price less exact than 10 / slope percent: the
interval (intervals.py) is then the honest answer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from experiments.disagg.h200_run1 import resim

ERRORS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "request_s")


def at_scale(call: Path, scale: float, out: Path) -> pd.DataFrame:
    path = out / "resim" / f"{'_'.join(call.parts[-2:])}_{scale:g}.csv"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        resim.main(["--run", str(call), "--set", f"backend.device_scale={scale:g}", "--out", str(path)])
    frame = pd.read_csv(path, dtype={"load": str})
    columns = {f"{m}_err_pct": m for m in ERRORS}
    return frame[["fleet", "workload", "load", *columns]].rename(columns=columns).assign(call=str(call), scale=scale)


def slopes(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per call and cell, the metric's error by factor and its slope in points per 1% of price."""
    wide = table.pivot_table(index=["call", "workload", "load"], columns="scale", values=metric)
    scales = np.asarray(wide.columns, dtype=float)
    wide["slope_per_pct"] = [np.polyfit(100 * (scales - 1), row, 1)[0] for row in wide.to_numpy(float)]
    return wide


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("calls", nargs="+", type=Path, help="run_disagg measure folders")
    parser.add_argument("--scales", nargs="+", type=float, required=True, help="backend.device_scale factors")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if len(args.scales) < 2 or min(args.scales) <= 0:
        raise SystemExit(f"--scales: at least two factors > 0, got {args.scales}")
    frames = [at_scale(call, scale, args.out) for call in tqdm(args.calls, unit="call") for scale in args.scales]
    table = pd.concat(frames, ignore_index=True)
    table.to_csv(args.out / "sensitivity.csv", index=False)
    print(slopes(table, "tpot_p50_s").round(1).to_string())
    print(f"wrote {args.out / 'sensitivity.csv'}")


if __name__ == "__main__":
    main()
