"""How much longer a served run's small decode CUDA-graph steps took than the profile prices them,
in seconds a step: a constant, or a price per context token or sequence? From the held-out
protocol's step replays (fidelity.steps_dir), priced as the call priced them (the replay's
predicted_execute_<cost model>_s). No GPU needed.

Per replay: the median excess of its decode graph steps of at most --max-seqs sequences, the
median in bins of their total context, and the least-squares line excess = a + b x context (per
1,000 tokens) + c x sequences + d x (the step before was a prefill). Writes one row per replay.

    python -m experiments.fidelity.cause.decode_excess STEPS_DIR --out decode_excess.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.fidelity.cause.host_scales import REPLAY, replay_paths

CONTEXT_BINS_K = (0, 2, 4, 8, 16, 32, 64, np.inf)  # total context of a step, thousands of tokens


def excess_row(path: Path, cost_model: str, max_seqs: int) -> dict:
    """One replay's decode graph excess (module docstring); seconds."""
    match = REPLAY.search(path.name)
    if match is None:
        raise ValueError(f"{path}: not a replay (<class>_<load>_<repeat>.csv.gz)")
    steps = pd.read_csv(path)
    after_prefill = (steps["kind"].shift(1) == "prefill").astype(float)
    small = (steps["kind"] == "decode") & (steps["cuda_graph"] == 1) & (steps["num_seqs"] <= max_seqs)
    if not small.any():
        raise ValueError(f"{path}: no decode graph steps of at most {max_seqs} sequences")
    excess = (steps["measured_execute_s"] - steps[f"predicted_execute_{cost_model}_s"])[small]
    context_k = steps["decode_context_tokens"][small] / 1000.0
    design = np.column_stack([np.ones(len(excess)), context_k, steps["num_seqs"][small], after_prefill[small]])
    (constant, per_k, per_seq, after), *_ = np.linalg.lstsq(design, excess.to_numpy(), rcond=None)
    row = {**match.groupdict(), "steps": int(small.sum()), "median_excess_s": float(excess.median()),
           "median_measured_s": float(steps["measured_execute_s"][small].median()), "line_constant_s": constant,
           "line_per_1k_context_s": per_k, "line_per_seq_s": per_seq, "line_after_prefill_s": after}
    bins = pd.cut(context_k, CONTEXT_BINS_K)
    for interval, part in excess.groupby(bins, observed=True):
        row[f"median_excess_s_context_{interval.left:g}k_{interval.right:g}k"] = float(part.median())
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps_dir", type=Path, help="a held-out call's steps/ folder (fidelity.steps_dir)")
    parser.add_argument("--cost-model", default="profiled", help="whose predicted_execute column (default profiled)")
    parser.add_argument("--max-seqs", type=int, default=32, help="the largest decode batch counted (default 32)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        table = pd.DataFrame([excess_row(path, args.cost_model, args.max_seqs)
                              for path in replay_paths(args.steps_dir)])
    except (ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    shown = ["load", "repeat", "steps", "median_measured_s", "median_excess_s", "line_constant_s",
             "line_per_1k_context_s"]
    print(table[shown].to_string(index=False, float_format=lambda v: f"{v:.2e}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
