"""Each committed profiling grid's prefill rows priced by its own grid fit, without and with the
prefill kernel's program term (sim.prefill_programs): per regime (graph, eager) and kind of row
(fresh prompts, after a cached context), the range of the per-size median errors and the worst row
(experiments/fidelity/cause/prefill_rows.py's numbers, for every grid at once). Both fits are made
here from the grid as harness.fidelity.calibrate makes them. No GPU needed (~1 min).

    python -m experiments.fidelity.prefill_programs_summary --out experiments/fidelity/prefill_programs_summary.csv
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import pandas as pd

from experiments.fidelity.cause.prefill_rows import SIZE, prefill_rows
from harness.calibration.fit import fit_calibration
from harness.config import load_hardware, model_spec
from sim.prefill_programs import PrefillPrograms

# (grid, model preset, conf/hardware name): the committed grids with measured device times
GRIDS = (
    ("experiments/fidelity/code_completion_h200_r2/qwen3-0.6b/profile.csv.gz", "qwen3-0.6b", "h200"),
    ("experiments/fidelity/h100_leakfree/profile.csv.gz", "qwen3-0.6b", "h100"),
    ("experiments/calibration/h100_run6/qwen3_8b/profile.csv", "qwen3-8b", "h100"),
    ("experiments/fidelity/h100_30b_r2/qwen3-30b-a3b/profile.csv.gz", "qwen3-30b-a3b", "h100"),
)


def summary_rows(grid_path: str, model: str, hardware: str) -> list[dict]:
    grid = pd.read_csv(grid_path)
    programs = PrefillPrograms.of(model_spec({"preset": model}), load_hardware(hardware, "hardware"))
    rows = []
    for term, kernel in (("without", None), ("with", programs)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitted = fit_calibration(grid, None, (), kernel)
        for regime, size in SIZE.items():
            if f"gpu:{regime}" not in fitted.fits:
                continue
            priced = prefill_rows(grid, fitted, regime)
            for kind, part in priced.groupby(priced["context_per_seq"] > 0):
                medians = part.groupby(size)["error"].median()
                worst = part["error"].iloc[part["error"].abs().argmax()]
                rows.append({"grid": grid_path, "model": model, "hardware": hardware, "term": term,
                             "regime": regime, "rows": "after a cached context" if kind else "fresh prompts",
                             "count": len(part), "median_min": medians.min(), "median_max": medians.max(),
                             "worst_row": worst})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    table = pd.DataFrame([row for grid in GRIDS for row in summary_rows(*grid)])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.round(4).to_csv(args.out, index=False)
    show = table.assign(grid=table["model"] + " " + table["hardware"])
    for column in ("median_min", "median_max", "worst_row"):
        show[column] = (100 * show[column]).round(1)
    print(show.drop(columns=["model", "hardware"]).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
