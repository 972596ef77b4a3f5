"""Fit the profiled model again from a calibration folder's measurements (no GPU), and validate it.

  PYTHONPATH=. python experiments/calibration/refit.py experiments/calibration/qwen3_0_6b_h100 --out DIR

Reads profile.csv (the grid and random shapes), calibration/steps.csv (the calibration run's
recorded steps; with --extra-steps, other recorded runs too) and meta.json (the engine's CUDA-graph
sizes) from the folder; writes model.csv and validation.csv (harness.calibration.validate) to --out. Steps recorded before the num_seeded
feature existed get it from the workload's temperature (--temperature: every harness request
carries a seed, so with temperature > 0 every sampled row was seeded).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.calibration import validate, with_seeded_rows  # noqa: E402
from harness.compare import engine_graph_sizes  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a calibrate_and_compare.py output folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--temperature", type=float, default=0.6, help="the calibration workload's temperature")
    parser.add_argument("--extra-steps", type=Path, nargs="*", default=[],
                        help="steps.csv of other recorded engine runs to fit on too (e.g. other workloads)")
    args = parser.parse_args(argv)
    meta = json.loads((args.folder / "meta.json").read_text())
    sizes = engine_graph_sizes(meta)
    profile = pd.read_csv(args.folder / "profile.csv")
    runs = [args.folder / "calibration" / "steps.csv", *args.extra_steps]
    steps = pd.concat([with_seeded_rows(pd.read_csv(path), args.temperature) for path in runs], ignore_index=True)
    model, validation = validate(profile, steps, sizes)
    args.out.mkdir(parents=True, exist_ok=True)
    model.to_csv(args.out / "model.csv")
    validation.to_csv(args.out / "validation.csv", index=False)
    print(validation.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
