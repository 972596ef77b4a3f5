"""Where the interval's machine factor (sim.interval.DEFAULT_MACHINE_SPREAD, the floor of every
model's machine_spread) comes from: H100 step times measured on several machines, none of them a
held-out cell. No GPU needed.

    python experiments/fidelity/machine_spread.py

Prints two tables:
- served: decode graph steps of the calibration runs (run 5, run 6 and a third machine's two
  repeats for Qwen3-0.6B; run 6 for Qwen3-8B) against the price of a grid fit, (priced - measured)
  / measured summed over a run's steps. This is what the factor multiplies: a served step's price.
  The floor is the largest deviation, rounded up to the percent.
- grids: the same grid shapes profiled by different calls, the median ratio of their device time
  (gpu_s) per pair of calls, and a committed fit's median error on another call's grid. Short
  bursts of repeated steps agree within about 1% between calls; the served steps deviate more.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from harness.scripting import one_line_errors
from sim.interval import DEFAULT_MACHINE_SPREAD
from sim.profiled import ProfiledCostModel
from sim.profiled_validation import relative_errors

ROOT = Path(__file__).resolve().parents[2]
RUN6 = ROOT / "experiments" / "calibration" / "h100_run6"
FIDELITY = ROOT / "experiments" / "fidelity"
# grids of one model from different calls (the 0.6B's first at code 69a90b0, the others a day later)
GRIDS = {"qwen3-0.6b": {"run 6": RUN6 / "qwen3_0_6b" / "profile.csv",
                        "prefill_preempt": FIDELITY / "h100_prefill_preempt" / "profile.csv.gz",
                        "lead": FIDELITY / "h100_lead" / "profile.csv.gz",
                        "leakfree": FIDELITY / "h100_leakfree" / "profile.csv.gz"}}
# (model, fit, grid of another call)
CROSS = [("qwen3-8b", FIDELITY / "h100_8b" / "qwen3-8b_grid_fit.csv", RUN6 / "qwen3_8b" / "profile.csv"),
         ("qwen3-0.6b", FIDELITY / "h100_leakfree" / "profile_model.csv", RUN6 / "qwen3_0_6b" / "profile.csv")]
SHAPE = ["num_prefill_tokens", "num_decode_tokens", "num_seqs", "prefill_context_tokens",
         "decode_context_tokens", "cuda_graph", "graph_batch_size", "kind", "set"]


def served() -> pd.DataFrame:
    """Per calibration run: its served decode graph steps' summed error against the fit."""
    small = pd.read_csv(RUN6 / "qwen3_0_6b_repeat" / "replay_decode.csv")
    rows = [{"model": "qwen3-0.6b", "run": f"{r.engine_run}, {r.workload}", "fit": "run 6 grid",
             "steps": int(r.decode_graph_steps), "err": float(r.err)} for r in small.itertuples()]
    large = pd.read_csv(RUN6 / "qwen3_8b" / "validation.csv").query(
        "set == 'real_steps' and regime == 'decode_graph'").iloc[0]
    rows.append({"model": "qwen3-8b", "run": "run 6, calibration run", "fit": "run 6 grid (its own machine)",
                 "steps": int(large["steps"]), "err": float(large["sum_rel_error"])})
    return pd.DataFrame(rows)


def grids() -> pd.DataFrame:
    """Per pair of calls of one model: shapes in common and the median gpu_s ratio; then a
    committed fit's median error on another call's grid."""
    rows = []
    for model, paths in GRIDS.items():
        tables = {name: pd.read_csv(path) for name, path in paths.items()}
        for a, b in itertools.combinations(tables, 2):
            both = tables[a].merge(tables[b], on=SHAPE, suffixes=("_a", "_b"))
            ratio = np.log(both["gpu_s_b"] / both["gpu_s_a"])
            rows.append({"model": model, "compared": f"{b} / {a} (device time)", "shapes": len(both),
                         "median": float(np.expm1(ratio.median()))})
    for model, fit, grid in CROSS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            err = relative_errors(ProfiledCostModel.load(fit), pd.read_csv(grid))
        rows.append({"model": model, "compared": f"{fit.parent.name} fit on {grid.parent.name} grid (priced err)",
                     "shapes": len(err), "median": float(np.median(err))})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)

    def run() -> int:
        steps = served()
        largest = float(steps["err"].abs().max())
        pd.set_option("display.width", 160)
        print(steps.to_string(index=False, float_format=lambda v: f"{v:+.4f}"))
        print(f"\nlargest |err| {largest:.4f}, rounded up to the percent {math.ceil(largest * 100) / 100:.2f}; "
              f"sim.interval.DEFAULT_MACHINE_SPREAD = {DEFAULT_MACHINE_SPREAD}\n")
        print(grids().to_string(index=False, float_format=lambda v: f"{v:+.4f}"))
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
