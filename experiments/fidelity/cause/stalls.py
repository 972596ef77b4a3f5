"""Could host stalls explain a class's miss? A held-out call's cells simulated again with a pause
of STALL seconds added every EVERY seconds of simulated time (a garbage collection's size and
rate), against the engine's values. A pause that large shows as a TTFT P90 tail at low load; a
cell whose engine has none rules it out. No GPU needed.

    python -m experiments.fidelity.cause.stalls experiments/fidelity/code_completion_h200/qwen3-0.6b/heldout.csv \\
        profiles/h200/qwen3-0.6b.csv --model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 1000 \\
        --stalls 3:0.3 2:0.3 1:0.1
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path

import pandas as pd

from engine.core.graph_sizes import planned_graph_sizes
from experiments.fidelity.resimulate import MAX_MODEL_LEN, cell_config
from harness.compare.study import sim_run_config
from harness.run import run_once
from harness.scripting import compose_run_config
from sim import build_sim_executor
from sim.cost_model import make_cost_model

METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")


class Stalled:
    """A cost model whose clock pauses stall_s every every_s seconds of priced steps."""

    def __init__(self, inner, every_s: float, stall_s: float) -> None:
        self.inner, self.every, self.stall = inner, every_s, stall_s
        self.clock, self.next = 0.0, every_s

    def step_time(self, plan) -> float:
        seconds = self.inner.step_time(plan)
        self.clock += seconds
        if self.every and self.clock >= self.next:
            self.next += self.every
            seconds += self.stall
            self.clock += self.stall
        return seconds

    def drained(self) -> None:
        self.inner.drained()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--hardware", required=True)
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--num-requests", type=int, required=True)
    parser.add_argument("--stalls", nargs="+", default=["3:0.3"], help="EVERY:STALL seconds")
    args = parser.parse_args(argv)
    variants = [(0.0, 0.0)] + [(float(a), float(b)) for a, _, b in (v.partition(":") for v in args.stalls)]
    base = compose_run_config([f"model={args.model}", f"hardware={args.hardware}", "backend=sim",
                               f"scheduler.max_model_len={MAX_MODEL_LEN}"])
    cells = pd.read_csv(args.table)
    cells = cells[cells["cost_model"] == cells["cost_model"].iloc[0]]
    meta = {"num_blocks": args.num_blocks, "graph_batch_sizes": [], "prefill_graph_sizes": [], "async_scheduling": True}
    for (workload, load), part in cells.groupby(["workload", "load"], sort=False):
        if str(load) == "offline":
            continue
        rc = cell_config(base, workload, str(load), float(part["rate_req_s"].iloc[0]), args.num_requests, None)
        rc = sim_run_config(rc, "profiled", str(args.profile), meta)
        rc = dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, execution=base.sim.execution))
        engine = part.set_index("metric")["engine"]
        for every, stall in variants:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graphs = planned_graph_sizes(rc.sim.execution, rc.scheduler.max_num_seqs,
                                             rc.scheduler.max_num_batched_tokens)
                cost = Stalled(make_cost_model(rc.model, rc.hardware, rc.sim, graphs), every, stall)
                executor = build_sim_executor(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler, cost)
                summary = run_once(rc, False, executor=executor).summary
            errors = " ".join(f"{m[:-2]} {100 * (float(summary[m]) / engine[m] - 1):+.1f}%" for m in METRICS)
            print(f"{workload} {load} every {every:g} s a {stall:g} s stall: {errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
