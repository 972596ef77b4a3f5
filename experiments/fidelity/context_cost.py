"""Where an MoE profile's decode context cost comes from: attention, or the experts the step touched.

On a profile's decode graph rows without a shared prefix (harness.calibration.profiling), per
batch B and context: the step's time, its time above B = 1 at about the same context (one
sequence touches k experts per layer whatever its context, so what B = 1 adds with context is
attention and KV reads), and the distinct experts per MoE layer that difference implies,
k + (t_B - t_1 - KV reads of the extra sequences) / (seconds per expert), the seconds per expert
fitted by least squares on the longest context of each B against the expectation D(B) at the skew.
Where the profile carries the engine's measured counts (moe_distinct_experts with
moe_expected_experts beside it: harness.calibration.expert_steps) they are printed next to it.

    python experiments/fidelity/context_cost.py experiments/fidelity/h100_30b/profile.csv.gz --skew 0.379 \\
        --out experiments/fidelity/h100_30b/context_cost.csv
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from sim.moe import ExpertRouting
from sim.specs import ModelSpec, preset_fields

BANDWIDTH = 3.35e12  # an H100's HBM3, bytes/s (conf/hardware/h100.yaml)


def implied_experts(profile: pd.DataFrame, spec: ModelSpec, skew: float) -> pd.DataFrame:
    rows = profile[(profile.kind == "decode") & (profile.set == "grid") & (profile.cuda_graph == 1)].copy()
    rows["context"] = rows.decode_context_tokens / rows.num_seqs
    routing = ExpertRouting(spec.num_experts, spec.num_experts_per_tok, skew)
    rows["expected"] = [routing.distinct(int(b)) for b in rows.num_seqs]
    single = rows[rows.num_seqs == 1].sort_values("context")
    # t_1 at each row's context, interpolated between B = 1's contexts
    rows["above_one_s"] = rows.duration_s - np.interp(rows.context, single.context, single.duration_s)
    kv_s = spec.kv_bytes_per_token / BANDWIDTH
    rows["extra_kv_s"] = (rows.num_seqs - 1) * rows.context * kv_s
    longest = rows[rows.num_seqs > 1].sort_values("context").groupby("num_seqs").tail(1)
    extra = longest.expected - spec.num_experts_per_tok
    per_expert = float(((longest.above_one_s - longest.extra_kv_s) * extra).sum() / (extra * extra).sum())
    rows["implied"] = spec.num_experts_per_tok + (rows.above_one_s - rows.extra_kv_s) / per_expert
    rows["per_expert_ms"] = per_expert * 1e3
    columns = ["num_seqs", "context", "duration_s", "above_one_s", "extra_kv_s", "expected", "implied", "per_expert_ms"]
    if "moe_expected_experts" in rows.columns:  # measured counts in moe_distinct_experts
        rows["measured"] = rows.moe_distinct_experts
        columns.append("measured")
    return rows[columns].sort_values(["num_seqs", "context"]).reset_index(drop=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile")
    parser.add_argument("--model", default="qwen3-30b-a3b")
    parser.add_argument("--skew", type=float, required=True, help="the call's routing skew (run.log)")
    parser.add_argument("--out", help="write the table here as CSV")
    args = parser.parse_args(argv)
    table = implied_experts(pd.read_csv(args.profile), ModelSpec(**preset_fields(args.model)), args.skew)
    if args.out:
        table.round(6).to_csv(args.out, index=False)
    shown = table.assign(ms=table.duration_s * 1e3, context=table.context.round()).drop(
        columns=["duration_s", "above_one_s", "extra_kv_s"])
    print(shown.round(2).to_string(index=False))


if __name__ == "__main__":
    main()
