"""Fit the routing locality (sim.moe_locality) to a profiling grid's per-step distinct experts, as
the held-out protocol fits it (harness.fidelity.routing.measured_locality), and say how well it
predicts rows it was not fitted to. For a grid recorded with per-step counts
(harness.calibration.expert_steps: profile.csv has moe_distinct_experts and moe_expected_experts).

    python experiments/fidelity/fit_locality.py experiments/fidelity/h100_30b_r2/qwen3-30b-a3b/profile.csv.gz \
        --model qwen3-30b-a3b --moe-routing-skew 0.379 --out experiments/fidelity/h100_30b_r2/locality

Writes locality.json (the locality the protocol would fit, and the one fitted to single-sequence
rows alone) and residuals.csv.gz (every row: measured count, the independent expectation, the
locality model's, and a power law n_eff = n^gamma's, as relative errors), and prints the absolute
relative errors (median / P90 / max) per group of rows:

- fit: the rows the protocol fits (harness.fidelity.routing.locality_rows), by kind; the column
  "fitted to one-sequence rows" holds the rows of several sequences out (prefills of several
  sequences, mixed steps: how sequences combine is predicted, not fitted);
- random: the grid's held-out random shapes of the same kinds (ragged chunks evened out:
  sim.features.row_sequences), and the kinds the model leaves out (cached context, shared prefix).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from harness.convert import ConfigError
from harness.fidelity.routing import LOCALITY_KINDS, locality_rows
from harness.scripting import compose_run_config, one_line_errors
from sim.features import EXPECTED_EXPERTS, row_sequences
from sim.moe import expected_distinct_experts
from sim.moe_locality import SequenceRouting, fit_routing_locality


def power_law(steps: list[list[int]], gamma: float, experts: int, k: int, skew: float) -> np.ndarray:
    """n_eff(n) = n^gamma fresh draws per sequence: D(sum of n_i^gamma)."""
    return np.array([expected_distinct_experts(sum(n ** gamma for n in s), experts, k, skew) for s in steps])


def fit_power(steps: list[list[int]], observed: np.ndarray, experts: int, k: int, skew: float) -> float:
    grid = np.linspace(0.0, 1.0, 201)
    losses = [np.sum(np.log(power_law(steps, g, experts, k, skew) / observed) ** 2) for g in grid]
    return float(grid[int(np.argmin(losses))])


def group_of(row: pd.Series, fitted: pd.Index) -> str:
    if row.name in fitted:
        if row["num_prefill_tokens"] == 0:
            return "fit: decode batches"
        return "fit: one sequence" if row["num_seqs"] == 1 else f"fit: {row['kind']} of several sequences"
    if row["kind"] not in LOCALITY_KINDS:
        return f"{row['set']} {row['kind']} (left out)"
    if row["prefill_context_tokens"] > 0:
        return f"{row['set']} cached context (left out)"
    return f"{row['set']} {row['kind']}"


def summary(errors: pd.Series) -> str:
    a = errors.abs()
    return f"{a.median():.1%} / {a.quantile(0.9):.1%} / {a.max():.1%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="a grid's profile.csv with per-step counts")
    parser.add_argument("--model", required=True, help="conf/model name")
    parser.add_argument("--moe-routing-skew", type=float, required=True, help="the skew the call fitted (its log)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    def run() -> int:
        model = compose_run_config([f"model={args.model}"]).model
        table = pd.read_csv(args.profile)
        if EXPECTED_EXPERTS not in table.columns:
            raise ConfigError(f"profile: {args.profile} has no per-step counts ({EXPECTED_EXPERTS} beside them)")
        e, k, skew = model.num_experts, model.num_experts_per_tok, args.moe_routing_skew
        steps = [row_sequences(p, d, s) for p, d, s in
                 zip(table["num_prefill_tokens"], table["num_decode_tokens"], table["num_seqs"], strict=True)]
        table["steps"] = steps
        rows = locality_rows(table)
        single = rows[rows["num_seqs"] == 1]
        fit = lambda part: fit_routing_locality(list(part["steps"]), part["moe_distinct_experts"], e, k, skew)  # noqa: E731
        locality, locality_single = fit(rows), fit(single)
        gamma = fit_power(list(rows["steps"]), rows["moe_distinct_experts"].to_numpy(), e, k, skew)
        measured = table["moe_distinct_experts"]
        local = SequenceRouting(e, k, skew, locality)
        held = SequenceRouting(e, k, skew, locality_single)
        table = table.assign(
            group=[group_of(r, rows.index) for _, r in table.iterrows()],
            independent_err=table[EXPECTED_EXPERTS] / measured - 1,
            local=[local.distinct(s) for s in steps],
            power_err=power_law(steps, gamma, e, k, skew) / measured - 1,
            single_fit_err=[held.distinct(s) for s in steps] / measured - 1)
        table["local_err"] = table["local"] / measured - 1
        args.out.mkdir(parents=True, exist_ok=True)
        table.drop(columns="steps").to_csv(args.out / "residuals.csv.gz", index=False)
        result = {"moe_routing_locality": locality, "fitted_rows": len(rows),
                  "locality_single_sequence_rows": locality_single, "single_sequence_rows": len(single),
                  "power_law_gamma": gamma, "moe_routing_skew": skew}
        (args.out / "locality.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result))
        print("abs relative error of the distinct experts, median / P90 / max")
        print("| rows | n | independent | locality | fitted to one-sequence rows | power law |")
        print("|---|---|---|---|---|---|")
        for name, part in table.groupby("group", sort=True):
            print(f"| {name} | {len(part)} | {summary(part['independent_err'])} | {summary(part['local_err'])} | "
                  f"{summary(part['single_fit_err'])} | {summary(part['power_err'])} |")
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
