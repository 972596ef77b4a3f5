"""Where a simulated cell's time goes, step by step: each step the profiled model priced, with its
regime, new tokens, device time (gpu fit), launches, lead, the host time its predecessor left free
and the price, summed by group. The simulator's side of a step replay, for cells whose engine
steps did not come back. No GPU needed.

    python -m experiments.fidelity.cause.priced_steps experiments/fidelity/code_completion_h200/qwen3-0.6b/heldout.csv \
        profiles/h200/qwen3-0.6b.csv --model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 1000 \
        --load 0.95
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from engine.core.graph_sizes import planned_graph_sizes
from experiments.fidelity.resimulate import MAX_MODEL_LEN, cell_config
from harness.compare.study import sim_run_config
from harness.run import run_once
from harness.scripting import compose_run_config
from sim import build_sim_executor
from sim.cost_model import make_cost_model
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
    base = compose_run_config([f"model={model}", f"hardware={hardware}", "backend=sim",
                               f"scheduler.max_model_len={MAX_MODEL_LEN}"])
    cells = pd.read_csv(table)
    rate = float(cells.loc[cells["load"].astype(str) == load, "rate_req_s"].iloc[0]) if load != "offline" else 0.0
    workload = str(cells["workload"].iloc[0])
    rc = cell_config(base, workload, load, rate, num_requests, None)
    meta = {"num_blocks": num_blocks, "graph_batch_sizes": [], "prefill_graph_sizes": [], "async_scheduling": True}
    rc = sim_run_config(rc, "profiled", str(profile), meta)
    rc = dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, execution=base.sim.execution))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphs = planned_graph_sizes(rc.sim.execution, rc.scheduler.max_num_seqs, rc.scheduler.max_num_batched_tokens)
        cost = make_cost_model(rc.model, rc.hardware, rc.sim, graphs)
        recording = Recording(cost)
        executor = build_sim_executor(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler, cost)
        summary = run_once(rc, False, executor=executor).summary
    return pd.DataFrame(recording.rows), summary


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--hardware", required=True)
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--num-requests", type=int, required=True)
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
