"""Measured against predicted step time by kind of step, from per-step replays: a comparison's
compare_steps.csv (`experiment=compare`) or the held-out protocol's fidelity.steps_dir files
(harness.fidelity.steps). Decode steps are grouped by batch size, prefill and mixed steps by whether
they replayed a CUDA graph or ran eagerly (past the prefill graphs). No GPU needed.

--detail splits further, for traffic whose latency sits in the prefill steps between a request's
tokens (long prompts, few output tokens: the code_completion class): prefill steps also by their
new tokens (<=1k, 1-2k, 2-4k, 4-8k, 8-16k, >16k) and every step by what ran before it on the
device ("after prefill", "after decode", or "after idle" where the loop slept for an arrival, so the
step paid its whole lead). Each group also shows the device's measured idle time before its steps
(host_s: the host work the overlap did not hide; a cost model without a host fit predicts none).

A replay row may stand for several steps (a `num_steps` column, default 1: a simulator's
fast-forwarded run of decode steps): it counts that many steps.

    python experiments/fidelity/step_groups.py RUN_DIR_OR_REPLAY [...] [--cost-model profiled] [--detail]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

DECODE_BATCH_EDGES = (0, 8, 16, 32, 64, 128, 256, 512, 1024)
PREFILL_TOKEN_EDGES = (0, 1024, 2048, 4096, 8192, 16384, np.inf)


def step_counts(steps: pd.DataFrame) -> pd.Series:
    """Steps each row stands for: its num_steps where the table has one, else 1."""
    if "num_steps" in steps.columns:
        return steps["num_steps"].fillna(1).astype(int)
    return pd.Series(1, index=steps.index)


def step_group(steps: pd.DataFrame) -> pd.Series:
    """decode (lo, hi] by batch size; prefill, CUDA graph; prefill, eager."""
    buckets = pd.cut(steps["num_seqs"], DECODE_BATCH_EDGES).astype(str)
    return pd.Series(np.where(steps["kind"] == "decode", "decode " + buckets,
                              np.where(steps["cuda_graph"] == 1, "prefill, CUDA graph", "prefill, eager")),
                     index=steps.index)


def predecessor(steps: pd.DataFrame) -> pd.Series:
    """What ran on the device before each step: "after idle" (the first step, or one the loop slept
    before: slept_s > 0), else "after prefill" or "after decode" (a mixed step counts as prefill)."""
    before = steps["kind"].shift(1)
    label = np.where(before == "decode", "after decode", "after prefill")
    idle = steps["step"].eq(0) | before.isna()
    if "slept_s" in steps.columns:
        idle |= steps["slept_s"].fillna(0) > 0
    return pd.Series(np.where(idle, "after idle", label), index=steps.index)


def detail_group(steps: pd.DataFrame) -> pd.Series:
    """step_group, prefill steps split by new tokens where the replay has them, and every group by
    its predecessor (predecessor)."""
    group = step_group(steps)
    if "num_prefill_tokens" in steps.columns:
        tokens = pd.cut(steps["num_prefill_tokens"], PREFILL_TOKEN_EDGES).astype(str)
        group = group.where(steps["kind"] == "decode", group + " " + tokens)
    return group + ", " + predecessor(steps)


def step_groups(steps: pd.DataFrame, cost_model: str = "profiled", detail: bool = False) -> pd.DataFrame:
    """Per group: count, measured and predicted seconds (sums), the relative error, and (where the
    replay has the features) the share of decode KV reads that were repeats of a shared block;
    with detail, the finer groups (detail_group) and the measured idle before the steps (host_s)."""
    table = steps.assign(group=detail_group(steps) if detail else step_group(steps), counted=step_counts(steps))
    aggregations = {"steps": ("counted", "sum"), "measured_s": ("measured_s", "sum"),
                    "predicted_s": (f"predicted_{cost_model}_s", "sum")}
    if detail and "measured_host_s" in table.columns:
        aggregations["host_s"] = ("measured_host_s", "sum")
    if "decode_repeated_tokens" in table.columns:
        aggregations.update(context=("decode_context_tokens", "sum"), repeated=("decode_repeated_tokens", "sum"))
    grouped = table.groupby("group").agg(**aggregations)
    grouped["err"] = grouped["predicted_s"] / grouped["measured_s"] - 1.0
    if "repeated" in grouped.columns:
        grouped["repeated_share"] = grouped["repeated"] / grouped["context"].where(grouped["context"] > 0)
        grouped = grouped.drop(columns=["context", "repeated"])
    summed = [c for c in ("steps", "measured_s", "predicted_s", "host_s") if c in grouped.columns]
    total = grouped[summed].sum()
    grouped.loc["all steps"] = {**total, "err": total["predicted_s"] / total["measured_s"] - 1.0}
    if detail:
        grouped["share_of_time"] = grouped["measured_s"] / total["measured_s"]
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
    parser.add_argument("--detail", action="store_true",
                        help="prefill steps by new tokens, every step by what ran before it, idle time")
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
        print(step_groups(steps, args.cost_model, args.detail).round(4).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
