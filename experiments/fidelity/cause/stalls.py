"""Could host stalls explain a class's miss? A held-out call's cells simulated again with a pause
of STALL seconds added every EVERY seconds of simulated time (a garbage collection's size and
rate), against the engine's values. A pause that large shows as a TTFT P90 tail at low load; a
cell whose engine has none rules it out. No GPU needed.

    python -m experiments.fidelity.cause.stalls experiments/fidelity/code_completion_h200/qwen3-0.6b/heldout.csv \\
        profiles/h200/qwen3-0.6b.csv --model qwen3-0.6b --hardware h200 --num-blocks 4418 --num-requests 1000 \\
        --stalls 3:0.3 2:0.3 1:0.1
"""

from __future__ import annotations

import sys

import pandas as pd

from experiments.fidelity.cause.resimulated_cell import base_config, cell_parser, profiled_cell, simulate_cell

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
    parser = cell_parser(__doc__)
    parser.add_argument("--stalls", nargs="+", default=["3:0.3"], help="EVERY:STALL seconds")
    args = parser.parse_args(argv)
    variants = [(0.0, 0.0)] + [(float(a), float(b)) for a, _, b in (v.partition(":") for v in args.stalls)]
    base = base_config(args.model, args.hardware)
    cells = pd.read_csv(args.table)
    cells = cells[cells["cost_model"] == cells["cost_model"].iloc[0]]
    for (workload, load), part in cells.groupby(["workload", "load"], sort=False):
        if str(load) == "offline":
            continue
        rc = profiled_cell(base, workload, str(load), float(part["rate_req_s"].iloc[0]), args.num_requests,
                           args.profile, args.num_blocks)
        engine = part.set_index("metric")["engine"]
        for every, stall in variants:
            summary = simulate_cell(rc, lambda cost, every=every, stall=stall: Stalled(cost, every, stall))
            errors = " ".join(f"{m[:-2]} {100 * (float(summary[m]) / engine[m] - 1):+.1f}%" for m in METRICS)
            print(f"{workload} {load} every {every:g} s a {stall:g} s stall: {errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
