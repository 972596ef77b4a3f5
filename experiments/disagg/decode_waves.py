"""The decode kernel's waves (hardware.decode_programs_per_sm) weighed on every committed measure call,
with the measure calls' own pricing (the fleet intake, the idle start, the landed KV's write).

    python -m experiments.disagg.decode_waves [--resim-dir DIR] --out decode_waves_weighed.csv

The engine's split-KV decode kernel holds 5 programs per SM; a launch of more programs than the GPU
holds (660 on an H200) runs the rest as slots free up (sim.decode_programs); off by default
(decode_waves.md says why); with backend.decode_programs_baseline=grid_spread a step is charged
only what its contexts add over the grid's spread, with grid_waves what they add less that spread's
waves. Four variants, each call re-simulated with its engine's send path (kv_scatter.weigh): without
the waves, with them, with them over the grid's spread, and with them less the grid's waves;
comparisons within target per call and metric group, plus with --cells every call's TPOT errors
per cell at 0.8 load (where the 0.6B's decode batches cross 660 programs).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd

from experiments.disagg import kv_scatter
from experiments.disagg.tables import runs_path
from sim.decode_programs import GH100_DECODE_PROGRAMS_PER_SM

WITH_WRITE = kv_scatter.VARIANTS["intake+idle+scatter"]
WAVES = ["--set", f"hardware.decode_programs_per_sm={GH100_DECODE_PROGRAMS_PER_SM}"]
VARIANTS = {"intake+idle+scatter": WITH_WRITE,
            "+waves": [*WITH_WRITE, *WAVES],
            "+waves+grid_spread": [*WITH_WRITE, *WAVES, "--set", "backend.decode_programs_baseline=grid_spread"],
            "+waves+grid_waves": [*WITH_WRITE, *WAVES, "--set", "backend.decode_programs_baseline=grid_waves"]}
CELL_KEYS = ["fleet", "workload", "load"]


def cell_errors(resim_dir: Path, calls: tuple[tuple[str, str], ...]) -> pd.DataFrame:
    """Per call, variant and cell at 0.8 load: TPOT P50 / P90 simulated over measured - 1, in %."""
    rows = []
    for call, _ in calls:
        measured = pd.read_csv(runs_path(kv_scatter.HERE / call), dtype={"load": str})
        measured = measured[measured.side == "measured"].set_index(CELL_KEYS)
        for variant in VARIANTS:
            sim = pd.read_csv(resim_dir / f"{call.replace('/', '_')}__{variant}.csv", dtype={"load": str})
            for _, cell in sim[sim.load == "0.8"].iterrows():
                key = tuple(cell[k] for k in CELL_KEYS)
                if key not in measured.index:
                    continue
                engine = measured.loc[key]
                rows.append({"call": call, "variant": variant, **dict(zip(CELL_KEYS, key)),
                             **{f"{m}_error_pct": round(100 * (cell[m] / engine[m] - 1), 1)
                                for m in ("tpot_p50_s", "tpot_p90_s")}})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resim-dir", type=Path, default=Path(tempfile.gettempdir()) / "kv_scatter")
    parser.add_argument("--out", type=Path, default=None, help="the per-call counts' CSV")
    parser.add_argument("--cells", type=Path, default=None, help="the 0.8-load TPOT errors' CSV")
    args = parser.parse_args(argv)
    args.resim_dir.mkdir(parents=True, exist_ok=True)
    table = kv_scatter.weigh(args.resim_dir, VARIANTS, kv_scatter.CALLS)
    print(table.to_string(index=False))
    if args.out is not None:
        table.to_csv(args.out, index=False)
    if args.cells is not None:
        cell_errors(args.resim_dir, kv_scatter.CALLS).to_csv(args.cells, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
