"""Where a simulated cell's time goes, step by step: each step the profiled model priced, with its
regime, new tokens, device time (gpu fit), launches, lead, the host time its predecessor left free
and the price, summed by group. The simulator's side of a step replay, for cells whose engine
steps did not come back. No GPU needed.

    python -m experiments.fidelity.cause.priced_steps experiments/fidelity/code_completion_h200/qwen3-0.6b/heldout.csv \
        profiles/h200/qwen3-0.6b.csv --model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 1000 \
        --load 0.95
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.fidelity.cause.resimulated_cell import base_config, cell_parser, profiled_cell, simulate_cell
from sim.profiled import ProfiledCostModel
from sim.profiled_regimes import regime_of

TOKEN_EDGES = (0, 1024, 2048, 4096, 8192, 16384, np.inf)


class Recording:
    """Wraps a ProfiledCostModel's _price: every priced step's parts, in order."""

    def __init__(self, model: ProfiledCostModel) -> None:
        self.model, self.rows = model, []
        inner = model._price

        def price(features, step):
            previous = model._previous
            duration = inner(features, step)
            launch, gpu = model.overlap_parts(features)
            free = 0.0 if previous is None or not step else max(0.0, previous[0] - previous[1] - model.launch_delay_s)
            self.rows.append({"regime": regime_of(features), "tokens": features["num_prefill_tokens"],
                              "num_seqs": features["num_seqs"], "gpu": gpu, "launch": launch,
                              "lead": model._part("lead", features), "free": free, "price": duration})
            return duration

        model._price = price  # type: ignore[method-assign]


def priced_steps(table: Path, profile: Path, model: str, hardware: str, num_blocks: int, num_requests: int,
                 load: str) -> tuple[pd.DataFrame, object]:
    base = base_config(model, hardware)
    cells = pd.read_csv(table)
    rate = float(cells.loc[cells["load"].astype(str) == load, "rate_req_s"].iloc[0]) if load != "offline" else 0.0
    workload = str(cells["workload"].iloc[0])
    rc = profiled_cell(base, workload, load, rate, num_requests, profile, num_blocks)
    recordings: list[Recording] = []

    def record(cost: ProfiledCostModel) -> ProfiledCostModel:
        recordings.append(Recording(cost))
        return cost

    summary = simulate_cell(rc, record)
    return pd.DataFrame(recordings[0].rows), summary


def summarise(steps: pd.DataFrame) -> pd.DataFrame:
    bins = pd.cut(steps["tokens"], TOKEN_EDGES, right=False).astype(str)
    group = np.where(steps["regime"].str.startswith("decode"), steps["regime"], steps["regime"] + " " + bins)
    bound = np.where(steps["launch"] - steps["free"] >= steps["price"] - 1e-12, "launch-bound", "device-bound")
    table = steps.assign(group=group, launch_bound=bound == "launch-bound")
    total = table["price"].sum()
    return table.groupby("group").agg(steps=("price", "size"), share=("price", lambda p: p.sum() / total),
                                      price_ms=("price", lambda p: 1e3 * p.mean()),
                                      gpu_ms=("gpu", lambda p: 1e3 * p.mean()),
                                      launch_ms=("launch", lambda p: 1e3 * p.mean()),
                                      free_ms=("free", lambda p: 1e3 * p.mean()),
                                      launch_bound=("launch_bound", "mean"),
                                      seqs=("num_seqs", "mean")).round(3)


def main(argv: list[str] | None = None) -> int:
    parser = cell_parser(__doc__)
    parser.add_argument("--load", default="0.95")
    args = parser.parse_args(argv)
    steps, summary = priced_steps(args.table, args.profile, args.model, args.hardware, args.num_blocks,
                                  args.num_requests, args.load)
    print(f"load {args.load}: " + ", ".join(f"{m} {1e3 * float(summary[m]):.2f} ms" for m in
                                           ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")))
    print(summarise(steps).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
