"""Measured against predicted step time by kind of step, from per-step replays: a comparison's
compare_steps.csv (`experiment=compare`) or the held-out protocol's fidelity.steps_dir files
(harness.fidelity.steps). Decode steps are grouped by batch size, prefill and mixed steps by whether
they replayed a CUDA graph or ran eagerly (past the prefill graphs). No GPU needed.

    python experiments/fidelity/step_groups.py RUN_DIR_OR_REPLAY [...] [--cost-model profiled]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

DECODE_BATCH_EDGES = (0, 8, 16, 32, 64, 128, 256, 512, 1024)


def step_group(steps: pd.DataFrame) -> pd.Series:
    """decode (lo, hi] by batch size; prefill, CUDA graph; prefill, eager."""
    buckets = pd.cut(steps["num_seqs"], DECODE_BATCH_EDGES).astype(str)
    return pd.Series(np.where(steps["kind"] == "decode", "decode " + buckets,
                              np.where(steps["cuda_graph"] == 1, "prefill, CUDA graph", "prefill, eager")),
                     index=steps.index)


def step_groups(steps: pd.DataFrame, cost_model: str = "profiled") -> pd.DataFrame:
    """Per group: count, measured and predicted seconds (sums), the relative error, and (where the
    replay has the features) the share of decode KV reads that were repeats of a shared block."""
    table = steps.assign(group=step_group(steps))
    aggregations = {"steps": ("step", "size"), "measured_s": ("measured_s", "sum"),
                    "predicted_s": (f"predicted_{cost_model}_s", "sum")}
    if "decode_repeated_tokens" in table.columns:
        aggregations.update(context=("decode_context_tokens", "sum"), repeated=("decode_repeated_tokens", "sum"))
    grouped = table.groupby("group").agg(**aggregations)
    grouped["err"] = grouped["predicted_s"] / grouped["measured_s"] - 1.0
    if "repeated" in grouped.columns:
        grouped["repeated_share"] = grouped["repeated"] / grouped["context"].where(grouped["context"] > 0)
        grouped = grouped.drop(columns=["context", "repeated"])
    total = grouped[["steps", "measured_s", "predicted_s"]].sum()
    grouped.loc["all steps"] = {**total, "err": total["predicted_s"] / total["measured_s"] - 1.0}
    return grouped


def replay_table(path: Path) -> pd.DataFrame | None:
    """A replay file, or a run folder's compare_steps.csv; None if neither is there."""
    if path.is_dir():
        path = path / "compare_steps.csv"
    return pd.read_csv(path) if path.is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path,
                        help="comparison run folders (holding compare_steps.csv) or replay files")
    parser.add_argument("--cost-model", default="profiled")
    args = parser.parse_args(argv)
    for run in args.runs:
        steps = replay_table(run)
        if steps is None:
            print(f"error: {run} is neither a replay file nor a folder with compare_steps.csv "
                  "(run experiment=compare with output.steps=full, or fidelity.steps_dir)", file=sys.stderr)
            return 2
        if f"predicted_{args.cost_model}_s" not in steps.columns:
            print(f"error: {run} has no predictions of cost model {args.cost_model!r}", file=sys.stderr)
            return 2
        print(run)
        print(step_groups(steps, args.cost_model).round(4).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
