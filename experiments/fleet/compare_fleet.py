"""Engine fleet against simulated fleet: TTFT and TPOT P50/P90 of each engine_<case>/ and
sim_<case>/ pair under a folder (experiments/fleet/validate_dp_h200.sh writes them), with the
simulator's relative error; the issue's target is within 10%.

  python experiments/fleet/compare_fleet.py OUT   -> OUT/fleet_compare.csv, OUT/fleet_compare.md
  python experiments/fleet/compare_fleet.py OUT --sims OTHER   (OTHER/sim_<case>/: another cost model's
                                                               simulations, its tables under OTHER)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from harness.compare.tables import markdown

METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
TARGET = 0.10


def compare(folder: Path, sims: Path | None = None) -> pd.DataFrame:
    rows = []
    for engine_dir in sorted(folder.glob("engine_*")):
        case = engine_dir.name.removeprefix("engine_")
        sim_dir = (sims or folder) / f"sim_{case}"
        if not (sim_dir / "summary.csv").is_file():
            continue
        engine = pd.read_csv(engine_dir / "summary.csv").iloc[0]
        sim = pd.read_csv(sim_dir / "summary.csv").iloc[0]
        for metric in METRICS:
            error = (sim[metric] - engine[metric]) / engine[metric]
            rows.append({"case": case, "metric": metric, "engine": engine[metric], "sim": sim[metric],
                         "rel_error": error, "within_10pct": abs(error) <= TARGET})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="holds engine_<case>/ and sim_<case>/ run folders")
    parser.add_argument("--sims", type=Path, default=None, help="where the sim_<case>/ folders are (default: folder)")
    args = parser.parse_args(argv)
    table = compare(args.folder, args.sims)
    if table.empty:
        raise SystemExit(f"{args.folder}: no engine_<case>/ and sim_<case>/ pairs with summary.csv")
    out = args.sims or args.folder
    table.to_csv(out / "fleet_compare.csv", index=False)
    (out / "fleet_compare.md").write_text(markdown(table) + "\n")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
