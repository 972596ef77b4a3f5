"""What sets a cell's TTFT P90 when one burst holds a tenth of its requests, and how much of it is
phase: the simulated request at the P90 (how many arrived within a millisecond of it, how long it
waited for its first step, that step's kind, sequences and price), then the P90 again over DRAWS
runs whose every step price is multiplied by exp(N(0, SIGMA)) (steps a percent longer or shorter
move where a burst lands between step boundaries, not what the steps cost), with the decode
kernel's programs priced (sim.decode_programs) and without. Several calls' tables are pooled as
merge.py pools them: the mean of the calls' engine values against the mean of their simulations.
No GPU needed.

    python -m experiments.fidelity.cause.burst_phase experiments/fidelity/h100_leakfree/heldout.csv \
        experiments/fidelity/h100_second_lease/heldout_decode_heavy-conversation-bursty.csv \
        --profile experiments/fidelity/h100_leakfree/profile_model.csv --model qwen3-0.6b --hardware h100 \
        --num-blocks 2422 --num-requests 80 --workload bursty --loads 0.5 0.8 0.95
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
from experiments.fidelity.cause.resimulated_cell import base_config, profiled_cell
from harness.run import RunOutcome, run_once
from sim import build_sim_executor
from sim.cost_model import make_cost_model


class Jittered:
    """A cost model whose every step price is multiplied by exp(N(0, sigma))."""

    def __init__(self, inner, sigma: float, seed: int) -> None:
        self.inner, self.sigma, self.rng = inner, sigma, np.random.default_rng(seed)

    def step_time(self, plan) -> float:
        return self.inner.step_time(plan) * float(np.exp(self.rng.normal(0.0, self.sigma)))

    def drained(self) -> None:
        self.inner.drained()


def simulate(rc, sigma: float = 0.0, seed: int = 0) -> RunOutcome:
    graphs = planned_graph_sizes(rc.sim.execution, rc.scheduler.max_num_seqs, rc.scheduler.max_num_batched_tokens,
                                 max_model_len=rc.scheduler.max_model_len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost = make_cost_model(rc.model, rc.hardware, rc.sim, graphs)
        if sigma:
            cost = Jittered(cost, sigma, seed)
        executor = build_sim_executor(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler, cost)
        return run_once(rc, False, executor=executor, record=True)


def at_p90(outcome: RunOutcome) -> str:
    """The simulated request nearest the TTFT P90: its burst, its wait and its first step."""
    requests, steps = outcome.requests, outcome.steps
    p90 = float(np.percentile(requests["ttft"], 90))
    request = requests.iloc[int((requests["ttft"] - p90).abs().argmin())]
    burst = int((requests["arrival"] - request["arrival"]).abs().le(1e-3).sum())
    ends = steps["start"] + steps["duration"]
    first = steps.iloc[int((ends - request["first_token"]).abs().argmin())]
    waited = steps[(ends > request["arrival"]) & (steps["start"] < first["start"])]
    return (f"P90 {1e3 * p90:.2f} ms: {burst} requests within 1 ms of its arrival; it waited "
            f"{1e3 * (first['start'] - request['arrival']):.2f} ms (behind {len(waited)} steps of at most "
            f"{int(waited['num_seqs'].max()) if len(waited) else 0} sequences) for a {first['kind']} step of "
            f"{int(first['num_seqs'])} sequences, {int(first['num_prefill_tokens'])} new tokens, "
            f"{1e3 * first['duration']:.2f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", type=Path, nargs="+", help="each call's heldout.csv, pooled")
    for name in ("--profile", "--model", "--hardware", "--workload"):
        parser.add_argument(name, required=True)
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--num-requests", type=int, required=True)
    parser.add_argument("--loads", nargs="+", default=["0.5", "0.8"])
    parser.add_argument("--draws", type=int, default=30)
    parser.add_argument("--sigma", type=float, default=0.01)
    args = parser.parse_args(argv)
    base = base_config(args.model, args.hardware)
    for load in args.loads:
        engine, cells = [], []
        for path in args.tables:
            part = pd.read_csv(path)
            part = part[(part["workload"] == args.workload) & (part["load"].astype(str) == load)
                        & (part["metric"] == "ttft_p90_s")]
            if part.empty:
                continue
            engine.append(float(part["engine"].iloc[0]))
            cells.append(profiled_cell(base, args.workload, load, float(part["rate_req_s"].iloc[0]),
                                       args.num_requests, Path(args.profile), args.num_blocks))
        if not cells:
            continue
        pooled = float(np.mean(engine))
        print(f"{args.workload} {load}: engine TTFT P90 {1e3 * pooled:.2f} ms ({len(cells)} calls)")
        for programs in (True, False):
            runs = [dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, decode_programs=programs)) for rc in cells]
            point = [simulate(rc) for rc in runs]
            draws = np.mean([[float(simulate(rc, args.sigma, seed).summary["ttft_p90_s"]) for seed in range(args.draws)]
                             for rc in runs], axis=0)
            point_p90 = np.mean([float(p.summary["ttft_p90_s"]) for p in point])
            print(f"  decode programs {'on ' if programs else 'off'}: point {point_p90 / pooled - 1:+.1%}, over "
                  f"{args.draws} draws mean {draws.mean() / pooled - 1:+.1%} (10-90%: "
                  f"{np.percentile(draws, 10) / pooled - 1:+.1%} .. {np.percentile(draws, 90) / pooled - 1:+.1%})")
            for i, outcome in enumerate(point):
                print(f"    call {i}: {at_p90(outcome)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
