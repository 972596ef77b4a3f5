"""When the engine's loop planned each prefill step, against the simulator's, from a held-out step
replay (harness.fidelity.steps) and the cell simulated again. No GPU needed.

nano admits in arrival order, whole prompts, so a replay's prefill steps map onto the class's
requests (num_prefill_tokens, num_seqs; checked: every decode step's num_seqs is the requests
between their prefill and their last token). A prefill step's admitted requests arrived before
the loop planned it; measured from the start of the step before it on the device (S_k, during
which the loop plans S_k+1), an admitted arrival after that start says the loop planned later.
The replay's clock is anchored where the loop woke on an arrival (slept_s > 0). Printed per kind
of S_k (decode, prefill graph, eager prefill): the prefill steps after it, the share that admitted
a request that arrived after S_k began, the median and largest such lag (ms), S_k's median
duration, and the largest admitted arrival after S_k's end; then the requests' TPOT by output
length, engine (rebuilt) against simulator, and the prefill steps and tokens in their windows.

    python -m experiments.fidelity.cause.admission REPLAY.csv.gz PROFILE.csv --model qwen3-0.6b \\
        --hardware h100 --num-blocks 2422 --num-requests 1000 --load 0.8 --rate 75.14 --host-scale 1.83 \\
        [--plan-after-launches]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

OUTPUT_BINS = [1, 2, 3, 5, 10, 20, 40, 100, 10**6]


def simulated_cell(args: argparse.Namespace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The cell as resimulate.py prices it, with its steps' features (requests, steps)."""
    from experiments.fidelity.resimulate import MAX_MODEL_LEN, cell_config
    from harness.compare.study import sim_run_config
    from harness.run import run_once
    from harness.scripting import compose_run_config

    base = compose_run_config([f"model={args.model}", f"hardware={args.hardware}", "backend=sim",
                               f"scheduler.max_model_len={MAX_MODEL_LEN}"])
    rc = cell_config(base, args.workload, args.load, args.rate, args.num_requests, None)
    meta = {"num_blocks": args.num_blocks, "graph_batch_sizes": [], "prefill_graph_sizes": [], "async_scheduling": True}
    sim_rc = sim_run_config(rc, "profiled", str(args.profile), meta)
    sim_rc = dataclasses.replace(sim_rc, sim=dataclasses.replace(sim_rc.sim, execution=base.sim.execution,
                                                                 host_scale=args.host_scale,
                                                                 plan_after_launches=args.plan_after_launches))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_once(sim_rc, False, label="sim", record=True)
    requests = out.requests.sort_values("arrival").reset_index(drop=True)
    return requests, out.steps.sort_values("start").reset_index(drop=True)


def engine_steps(replay: pd.DataFrame, requests: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """The replay's steps with start and end on the arrivals' clock, and each request's prefill step."""
    r = replay.reset_index(drop=True)
    end = np.cumsum((r["slept_s"] + r["measured_s"]).to_numpy())
    prefill_step = np.repeat(np.flatnonzero(r["kind"] != "decode"), r.loc[r["kind"] != "decode", "num_seqs"])
    if len(prefill_step) != len(requests):
        raise ValueError(f"the replay prefills {len(prefill_step)} requests, the cell has {len(requests)}")
    prompts = np.cumsum(requests["prompt_tokens"].to_numpy())
    if not np.isin(np.cumsum(r.loc[r["kind"] != "decode", "num_prefill_tokens"]), prompts).all():
        raise ValueError("the replay's prefill steps do not split the cell's prompts in arrival order")
    first = pd.Series(requests["arrival"].to_numpy()).groupby(prefill_step).min()
    woke = first.index[(r.loc[first.index, "slept_s"] > 0).to_numpy()]
    start = end - r["measured_s"].to_numpy()
    offset = float(np.median(first[woke].to_numpy() - start[woke])) if len(woke) else 0.0
    return r.assign(start=start + offset, end=end + offset), prefill_step


def lags(steps: pd.DataFrame, arrivals: np.ndarray, prefill_step: np.ndarray, eager: pd.Series) -> pd.DataFrame:
    """Per prefill step not after an idle device: its predecessor's kind and the lags (docstring)."""
    start, end = steps["start"].to_numpy(), steps["end"].to_numpy()
    last = pd.Series(arrivals).groupby(prefill_step).max()
    rows = []
    for i, latest in last.items():
        if i < 1 or start[i] - end[i - 1] > 1e-6:
            continue
        kind = "decode" if steps["kind"].iat[i - 1] == "decode" else ("eager" if eager.iat[i - 1] else "graph")
        rows.append({"before": kind, "lag": latest - start[i - 1], "over_end": latest - end[i - 1],
                     "before_s": end[i - 1] - start[i - 1]})
    return pd.DataFrame(rows)


def lag_table(frame: pd.DataFrame) -> pd.DataFrame:
    ms = 1e3
    return frame.groupby("before").agg(
        steps=("lag", "size"), admitted_after_start=("lag", lambda x: (x > 0).mean()),
        median_lag_ms=("lag", lambda x: x.median() * ms), max_lag_ms=("lag", lambda x: x.max() * ms),
        before_ms=("before_s", lambda x: x.median() * ms), max_over_end_ms=("over_end", lambda x: x.max() * ms))


def windows(first: np.ndarray, finish: np.ndarray, steps: pd.DataFrame, duration: str) -> dict[str, np.ndarray]:
    """Per request: the prefill steps, their seconds and tokens in (first token, finish]."""
    prefill = (steps["kind"] != "decode").to_numpy()
    sums = {"prefill_steps": prefill * 1.0, "prefill_s": np.where(prefill, steps[duration], 0.0),
            "prefill_tokens": np.where(prefill, steps["num_prefill_tokens"], 0.0)}
    end = steps["end"].to_numpy()
    a = np.searchsorted(end, first + 1e-9, side="right")
    b = np.searchsorted(end, finish + 1e-9, side="right")
    totals = {k: np.concatenate(([0.0], np.cumsum(v))) for k, v in sums.items()}
    return {k: total[b] - total[a] for k, total in totals.items()}


def tpot_table(requests: pd.DataFrame, replay: pd.DataFrame, prefill_step: np.ndarray,
               sim_steps: pd.DataFrame) -> pd.DataFrame:
    """TPOT by output length, engine (its timeline rebuilt from the replay) and simulator."""
    end = replay["end"].to_numpy()
    tokens = requests["output_tokens"].to_numpy()
    first = end[prefill_step]
    finish = first.copy()
    admitted = {i: list(group) for i, group in pd.Series(np.arange(len(requests))).groupby(prefill_step)}
    left = tokens - 1
    running: list[int] = []
    for i, (kind, num_seqs) in enumerate(zip(replay["kind"], replay["num_seqs"])):
        if kind != "decode":
            running += [k for k in admitted[i] if left[k] > 0]
            continue
        if len(running) != num_seqs:
            raise ValueError(f"decode step {i}: {len(running)} requests running, the replay's {num_seqs}")
        for k in running:
            left[k] -= 1
            if left[k] == 0:
                finish[k] = end[i]
        running = [k for k in running if left[k] > 0]
    engine = pd.DataFrame({"tokens": tokens, "tpot": (finish - first) / np.maximum(tokens - 1, 1),
                           **windows(first, finish, replay, "measured_s")})
    sim_steps = sim_steps.assign(num_prefill_tokens=sim_steps["prefill_tokens"])
    sim = pd.DataFrame({"tokens": tokens, "tpot": requests["tpot"].to_numpy(),
                        **windows(requests["first_token"].to_numpy(), requests["finish"].to_numpy(), sim_steps,
                                  "duration")})
    both = pd.concat({"engine": engine, "sim": sim}, axis=1)
    both = both[tokens > 1]
    groups = both.groupby(pd.cut(both[("engine", "tokens")], OUTPUT_BINS), observed=True)
    table = groups.mean().drop(columns=[("engine", "tokens"), ("sim", "tokens")])
    table[("requests", "")] = groups.size()
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("replay", type=Path, help="a held-out step replay, <class>_<load>_<repeat>.csv.gz")
    parser.add_argument("profile", type=Path, help="the profiled model (model.csv) the cell is priced with")
    parser.add_argument("--model", required=True)
    parser.add_argument("--hardware", required=True)
    parser.add_argument("--num-blocks", type=int, required=True)
    parser.add_argument("--num-requests", type=int, required=True)
    parser.add_argument("--load", required=True, help="the cell's load (not offline: its arrivals are needed)")
    parser.add_argument("--rate", type=float, required=True, help="the cell's rate (heldout.csv rate_req_s)")
    parser.add_argument("--host-scale", type=float, default=1.0, help="the run's host (host_scales_runs.csv)")
    parser.add_argument("--workload", default="code_completion")
    parser.add_argument("--plan-after-launches", action="store_true",
                        help="simulate with backend.plan_after_launches (the loop plans after a prefill's launches)")
    args = parser.parse_args(argv)
    try:
        requests, sim = simulated_cell(args)
        replay, prefill_step = engine_steps(pd.read_csv(args.replay), requests)
        sim = sim.assign(end=sim["start"] + sim["duration"])
        sim_prefill = np.searchsorted(sim["end"].to_numpy(), requests["first_token"].to_numpy() - 1e-12)
        arrivals = requests["arrival"].to_numpy()
        for label, steps, where in (("engine", replay, prefill_step), ("sim", sim, sim_prefill)):
            print(f"{label}: prefill steps {int((steps['kind'] != 'decode').sum())}, plan lags by the step before")
            print(lag_table(lags(steps, arrivals, where, steps["cuda_graph"] == 0)).round(3).to_string())
        print(tpot_table(requests, replay, prefill_step, sim).to_string(float_format=lambda v: f"{v:.4g}"))
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
