"""Measured against predicted step time by kind of step, from a comparison's per-step table
(`experiment=compare` writes compare_steps.csv): decode steps, prefill and mixed steps replayed as a
CUDA graph, and those run eagerly (past the prefill graphs). No GPU needed.

    python experiments/fidelity/step_groups.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def step_groups(steps: pd.DataFrame, cost_model: str = "profiled") -> pd.DataFrame:
    """Per kind of step: count, measured and predicted seconds (sums), and the relative error."""
    kind = np.where(steps["kind"] == "decode", "decode",
                    np.where(steps["cuda_graph"] == 1, "prefill, CUDA graph", "prefill, eager"))
    grouped = steps.assign(group=kind).groupby("group").agg(
        steps=("step", "size"), measured_s=("measured_s", "sum"), predicted_s=(f"predicted_{cost_model}_s", "sum"))
    return grouped.assign(err=grouped["predicted_s"] / grouped["measured_s"] - 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="comparison run folders (hold compare_steps.csv)")
    parser.add_argument("--cost-model", default="profiled")
    args = parser.parse_args(argv)
    for run in args.runs:
        table = run / "compare_steps.csv"
        if not table.is_file():
            print(f"error: {table} is missing (run experiment=compare with output.steps=full)", file=sys.stderr)
            return 2
        print(run)
        print(step_groups(pd.read_csv(table), args.cost_model).round(4).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
