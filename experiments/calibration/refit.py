"""Fit the profiled model again from a calibration folder's measurements (no GPU), and validate it.

  python experiments/calibration/refit.py $OUT/qwen3_0_6b --out DIR

Reads profile.csv (the grid and random shapes), calibration/steps.csv(.gz) (the calibration run's
recorded steps; with --extra-steps, other recorded runs too) and meta.json (the engine's CUDA-graph
sizes) from the folder; writes model.csv and validation.csv (harness.calibration.fit.validate) to
--out. Steps recorded before the num_seeded feature existed get it from the workload's temperature
(--temperature: every harness request carries a seed, so with temperature > 0 every sampled row was seeded).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from harness.calibration.fit import validate, with_seeded_rows
from harness.compare.study import engine_graph_sizes
from harness.scripting import read_steps, require


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a calibrate_and_compare.py output folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--temperature", type=float, default=0.6, help="the calibration workload's temperature")
    parser.add_argument("--extra-steps", type=Path, nargs="*", default=[],
                        help="steps tables (or run folders) of other recorded engine runs to fit on too "
                             "(e.g. other workloads)")
    args = parser.parse_args(argv)
    meta = json.loads(require(args.folder / "meta.json").read_text())
    sizes = engine_graph_sizes(meta)
    profile = pd.read_csv(require(args.folder / "profile.csv"))
    runs = [args.folder / "calibration", *args.extra_steps]
    steps = pd.concat([with_seeded_rows(read_steps(path), args.temperature) for path in runs], ignore_index=True)
    model, validation = validate(profile, steps, sizes)
    args.out.mkdir(parents=True, exist_ok=True)
    model.to_csv(args.out / "model.csv")
    validation.to_csv(args.out / "validation.csv", index=False)
    print(validation.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
