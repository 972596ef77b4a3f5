"""What sets a cell's TTFT P90 when one burst holds a tenth of its requests, and how much of it is
phase: the simulated request at the P90 (how many arrived within a millisecond of it, how long it
waited for its first step, that step's kind, sequences and price), then the P90 again over DRAWS
runs whose every step price is multiplied by exp(N(0, SIGMA)) (steps a percent longer or shorter
move where a burst lands between step boundaries, not what the steps cost), with the decode
kernel's programs priced (sim.decode_programs) and without. Several calls' tables are pooled as
merge.py pools them: the mean of the calls' engine values against the mean of their simulations.
With --replays (one call's step replays, fidelity.steps_dir), the engine's side of the burst: each
run's largest prefill step and the prefill steps next to it (a burst cut by a step boundary shows
both parts), their measured time, launches and the replay's profiled price; and where every run
prefilled the simulated burst's new tokens in one step, the cell simulated again with such a step
priced at the engine's mean measured time (the rest of the model unchanged). No GPU needed.

    python -m experiments.fidelity.cause.burst_phase experiments/fidelity/h100_leakfree/heldout.csv.gz \
        experiments/fidelity/h100_second_lease/heldout_decode_heavy-conversation-bursty.csv.gz \
        --profile experiments/fidelity/h100_leakfree/profile_model.csv --model qwen3-0.6b --hardware h100 \
        --num-blocks 2422 --num-requests 80 --workload bursty --loads 0.5 0.8 0.95
    python -m experiments.fidelity.cause.burst_phase experiments/fidelity/h100_bursty_r1/heldout.csv.gz \
        --replays <the call's steps/> --profile experiments/fidelity/h100_leakfree/profile_model.csv \
        --model qwen3-0.6b --hardware h100 --num-blocks 2422 --num-requests 80 --workload bursty
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


class Repriced:
    """A cost model that prices every step of exactly `tokens` new prefill tokens at `seconds` (the
    engine's measured time of its burst step). The inner model still prices it, so its record of
    the step before the next one (what that step's lead can hide behind) keeps its own price."""

    def __init__(self, inner, tokens: int, seconds: float) -> None:
        self.inner, self.tokens, self.seconds = inner, tokens, seconds

    def step_time(self, plan) -> float:
        price = self.inner.step_time(plan)
        return self.seconds if plan.stats.num_prefill_tokens == self.tokens else price

    def drained(self) -> None:
        self.inner.drained()


def simulate(rc, sigma: float = 0.0, seed: int = 0, burst: tuple[int, float] | None = None) -> RunOutcome:
    """One simulated run of the cell: step prices jittered by sigma, or with burst = (tokens,
    seconds) a step of exactly that many new tokens priced at those seconds (Repriced)."""
    graphs = planned_graph_sizes(rc.sim.execution, rc.scheduler.max_num_seqs, rc.scheduler.max_num_batched_tokens,
                                 max_model_len=rc.scheduler.max_model_len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cost = make_cost_model(rc.model, rc.hardware, rc.sim, graphs)
        if sigma:
            cost = Jittered(cost, sigma, seed)
        if burst is not None:
            cost = Repriced(cost, *burst)
        executor = build_sim_executor(rc.model, rc.hardware, rc.sim, rc.cache, rc.scheduler, cost)
        return run_once(rc, False, executor=executor, record=True)


def p90_request(outcome: RunOutcome) -> tuple[pd.Series, pd.DataFrame]:
    """The simulated request nearest the TTFT P90 and its burst: the requests that arrived within
    1 ms of it."""
    requests = outcome.requests
    p90 = float(np.percentile(requests["ttft"], 90))
    request = requests.iloc[int((requests["ttft"] - p90).abs().argmin())]
    return request, requests[(requests["arrival"] - request["arrival"]).abs().le(1e-3)]


def burst_tokens(outcome: RunOutcome) -> int:
    """The new prompt tokens of the P90 request's burst (its prompts less their cached tokens)."""
    burst = p90_request(outcome)[1]
    return int((burst["prompt_tokens"] - burst["cached_tokens"]).sum())


def at_p90(outcome: RunOutcome) -> str:
    """The simulated request nearest the TTFT P90: its burst, its wait and its first step."""
    steps = outcome.steps
    request, requests = p90_request(outcome)
    p90, burst = float(np.percentile(outcome.requests["ttft"], 90)), len(requests)
    ends = steps["start"] + steps["duration"]
    first = steps.iloc[int((ends - request["first_token"]).abs().argmin())]
    waited = steps[(ends > request["arrival"]) & (steps["start"] < first["start"])]
    return (f"P90 {1e3 * p90:.2f} ms: {burst} requests within 1 ms of its arrival; it waited "
            f"{1e3 * (first['start'] - request['arrival']):.2f} ms (behind {len(waited)} steps of at most "
            f"{int(waited['num_seqs'].max()) if len(waited) else 0} sequences) for a {first['kind']} step of "
            f"{int(first['num_seqs'])} sequences, {int(first['num_prefill_tokens'])} new tokens, "
            f"{1e3 * first['duration']:.2f} ms")


# prefill steps this close to a run's largest count as its burst's: a burst cut by a step boundary
# is prefilled in consecutive steps, as the simulator does it
BURST_STEPS = 3


def engine_burst(replays: list[Path], tokens: int) -> tuple[list[str], float | None]:
    """Each engine run's largest prefill step and the prefill steps within BURST_STEPS of it (one
    line a run), and the runs' mean measured time of that step where in every run it holds exactly
    the burst's `tokens` new tokens (the burst prefilled in one step; else None)."""
    lines, one_step = [], []
    for path in replays:
        steps = pd.read_csv(path)
        prefills = steps[steps["num_prefill_tokens"] > 0]
        if prefills.empty:
            lines.append(f"    engine {path.name}: no prefill step")
            continue
        largest = prefills.loc[prefills["num_prefill_tokens"].idxmax()]
        near = prefills[(prefills["step"] - largest["step"]).abs() <= BURST_STEPS]
        parts = [f"step {int(s.step)}: {int(s.num_seqs)} sequences, {int(s.num_prefill_tokens)} new tokens, "
                 f"{'graph' if s.cuda_graph else 'eager'}, {1e3 * s.measured_s:.2f} ms (launches "
                 f"{1e3 * s.launch_s:.2f} ms; the replay's profiled price {1e3 * s.predicted_profiled_s:.2f} ms)"
                 for s in near.itertuples()]
        lines.append(f"    engine {path.name}: " + "; ".join(parts))
        if int(largest["num_prefill_tokens"]) == tokens:
            one_step.append(float(largest["measured_s"]))
    return lines, float(np.mean(one_step)) if replays and len(one_step) == len(replays) else None


def engine_side(rc, replays: Path, workload: str, load: str, pooled: float) -> None:
    """Print the engine's burst steps of the cell's replays (engine_burst) and, where every run
    prefilled the burst in one step, the cell simulated with that step at the engine's time."""
    tokens = burst_tokens(simulate(rc))
    paths = sorted(replays.glob(f"{workload}_{load}_[0-9]*.csv.gz"))
    if not paths:
        print(f"  engine: no replay {workload}_{load}_<repeat>.csv.gz under {replays}")
        return
    lines, seconds = engine_burst(paths, tokens)
    print(f"  engine (the burst: {tokens} new tokens), each run's largest prefill step and those within "
          f"{BURST_STEPS} steps:")
    print("\n".join(lines))
    if seconds is not None:
        p90 = float(simulate(rc, burst=(tokens, seconds)).summary["ttft_p90_s"])
        print(f"  simulated with a step of {tokens} new tokens priced at the engine's {1e3 * seconds:.2f} ms: "
              f"P90 {1e3 * p90:.2f} ms ({p90 / pooled - 1:+.1%})")


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
    parser.add_argument("--replays", type=Path, help="one call's step replays (its steps/ folder); one table only")
    args = parser.parse_args(argv)
    if args.replays is not None and len(args.tables) != 1:
        parser.error("--replays: the replays of one call go with that call's table alone")
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
        if args.replays is not None:
            engine_side(cells[0], args.replays, args.workload, load, pooled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
