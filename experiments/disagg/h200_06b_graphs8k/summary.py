"""Prefill graphs to 8,192 tokens against the default 4,096, side by side on one pair of H200s: the
measured cells of two `run_disagg measure` calls each (README.md), and their prefill steps.

    python -m experiments.disagg.h200_06b_graphs8k.summary PAIR_4K PAIR_8K [PAIR_4K PAIR_8K ...] --out DIR

Each PAIR_* is an unpacked bundle (runs.csv, steps_*.csv.gz). Writes DIR/measured.csv (each pair's
measured cells: 4,096 and 8,192 side by side and their ratio) and DIR/prefill_steps.csv.gz (per call,
cell and step size class, measured and simulated: steps, median duration and median launch, ms).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.disagg.kept_steps import read_kept
from experiments.disagg.tables import runs_path

METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "e2e_p50_s", "request_s")
SIZES = (0, 4096, 8192, np.inf)  # prefill step tokens: graphs either way, graphs at 8,192 only, eager either way
LABELS = ("<=4096", "4097-8192", ">8192")


def measured_pair(base: Path, graphs: Path) -> pd.DataFrame:
    """One pair's measured cells: each metric at 4,096 and 8,192 and 8,192 / 4,096."""
    sides = [pd.read_csv(runs_path(d), dtype={"load": str}).query("side == 'measured'")
             .set_index(["fleet", "workload", "load"])[list(METRICS)] for d in (base, graphs)]
    table = sides[0].add_suffix("_4096").join(sides[1].add_suffix("_8192"))
    for metric in METRICS:
        table[f"{metric}_ratio"] = (table[f"{metric}_8192"] / table[f"{metric}_4096"]).round(3)
    return table.reset_index().assign(pair=base.name)


def prefill_steps(call: Path) -> pd.DataFrame:
    """A call's steps that prefill, per cell, side and size class."""
    rows = []
    kept = sorted(call.glob("steps_*.csv.gz"))
    if not kept:
        raise SystemExit(f"no kept steps (steps_*.csv.gz) in {call}: its call ran without `measure --keep-steps`")
    for path in kept:
        steps = read_kept(path)
        steps = steps[steps["prefill_tokens"] > 0]
        size = pd.cut(steps["prefill_tokens"] + steps["decode_tokens"], SIZES, labels=LABELS)
        grouped = steps.groupby(["fleet", "workload", "load", "side", size], observed=True)
        table = grouped.agg(steps=("duration", "size"), duration_ms=("duration", "median"),
                            launch_ms=("launch_s", "median")).rename_axis(index={None: "tokens"})
        table[["duration_ms", "launch_ms"]] = (table[["duration_ms", "launch_ms"]] * 1e3).round(2)
        rows.append(table.reset_index().assign(call=call.name))
    return pd.concat(rows, ignore_index=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calls", nargs="+", type=Path, help="unpacked bundles: 4,096 then 8,192, pair by pair")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if len(args.calls) % 2:
        parser.error("calls come in pairs: a 4,096 bundle, then its 8,192 bundle")
    pairs = list(zip(args.calls[::2], args.calls[1::2], strict=True))
    measured = pd.concat([measured_pair(a, b) for a, b in pairs], ignore_index=True)
    steps = pd.concat([prefill_steps(c) for c in args.calls], ignore_index=True)
    args.out.mkdir(parents=True, exist_ok=True)
    measured.to_csv(args.out / "measured.csv", index=False, float_format="%.6g")
    steps.to_csv(args.out / "prefill_steps.csv.gz", index=False)
    ratios = [f"{m}_ratio" for m in METRICS]
    print(measured[["pair", "fleet", "load", *ratios]].to_string(index=False))
    print(f"wrote {args.out / 'measured.csv'} and {args.out / 'prefill_steps.csv.gz'}")


if __name__ == "__main__":
    main()
