"""Where a disaggregated fleet's TTFT goes on its prefill replicas, from a `run_disagg measure
--keep-steps` call's folder (steps_*.csv.gz, transfers.csv, runs.csv, settings.json). No GPU needed.

    python -m experiments.disagg.prefill_steps CALL_DIR [--trace CSV] [--out DIR]

Each prefill step of one prompt whose length is unique in its cell is matched to its request (the
call's workload rebuilt from settings.json and runs.csv: the same requests on both sides), to the
simulated side's step of the same prompt (its price, in the call's own pricing), and to the KV
sends from its replica (transfers.csv: a request's send starts transfer_wait_s after its prefill
step ends and lasts transfer_s). Per step (prefill_steps.csv.gz):

  regime            graph (at most --graph-tokens tokens: a CUDA graph replay) or eager
  duration_s, priced_s, over_priced   the measured step, the simulated step of the same prompt
  idle_start        the replica's device was idle before the step (gap over 0.5 ms)
  delay_s           arrival to the step's start where the replica was idle at the arrival: the
                    router's hand-over and the replica's loop until its first device work
                    (the simulated side's: 0)
  send_overlap      the share of the step during which a KV send of its replica was in flight
  held_tokens       KV held for other requests (back-pressure) as the step was planned

Per cell, pool side and regime (prefill_summary.csv): steps, mean ms measured and priced,
over_priced (time-weighted), excess_ms (mean measured less priced), slow_share (steps over 1.4x
their price) and the median of those, over_priced of the steps with and without a send in flight,
and the delay's P50 / P90 in ms beside the one-prompt TTFT's (delay + step, queueing included)
P50 on each side.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.disagg.kept_steps import read_kept
from experiments.disagg.tables import runs_path
from experiments.disagg.workloads import at_rate, class_workload
from harness.compare.tables import markdown
from harness.workloads.build import build_workload

MEASURED = "measured"
CELL = ["fleet", "workload", "load"]
IDLE_S = 5e-4  # a gap longer than this: the device had nothing queued before the step
SLOW = 1.4  # a step over this many times its price counts as slow
GPU_MAX_MODEL_LEN = 8192  # run_disagg's GPU runs (workloads.MEASURE_SCHEDULER); CPU runs: 512


def arrivals(call: Path, cell: dict, trace: str | None) -> pd.Series:
    """prompt length -> arrival time (s) of the cell's requests whose prompt length is unique."""
    settings = json.loads((call / "settings.json").read_text())
    args = settings["args"]
    runs = pd.read_csv(runs_path(call), dtype={"load": str})
    row = runs[(runs.side == MEASURED) & (runs.fleet == cell["fleet"]) & (runs.workload == cell["workload"])
               & (runs.load == cell["load"])].iloc[0]
    rate = None if math.isnan(row.rate_req_s) else float(row.rate_req_s)
    base = class_workload(cell["workload"], trace or settings.get("trace"), bool(args.get("cpu")))
    source = build_workload(at_rate(base, rate, int(row.num_requests)),
                            512 if args.get("cpu") else GPU_MAX_MODEL_LEN).source
    table = pd.DataFrame({"prompt": source.prompt[source.keep], "arrival": source.arrival[source.keep]})
    return table.drop_duplicates("prompt", keep=False).set_index("prompt")["arrival"]


def one_prompt_steps(steps: pd.DataFrame, block_size: int) -> pd.DataFrame:
    """A side's prefill-pool steps with their gap, and those of one prompt (prefill only)."""
    steps = steps.sort_values(["replica", "start"]).copy()
    steps["end"] = steps["start"] + steps["duration"]
    steps["previous_end"] = steps.groupby("replica")["end"].shift(1)
    steps["gap_s"] = steps["start"] - steps["previous_end"]
    own = np.ceil(steps["prefill_tokens"] / block_size) * block_size
    steps["held_tokens"] = (steps["kv_tokens"] - own).clip(lower=0)
    return steps[(steps["requests"] == 1) & (steps["decode_tokens"] == 0) & (steps["prefill_tokens"] > 0)]


def send_overlap(steps: pd.DataFrame, transfers: pd.DataFrame) -> pd.Series:
    """Each step's share of time with a KV send of its replica in flight."""
    sender = steps.drop_duplicates("prefill_tokens", keep=False).set_index("prefill_tokens")
    moved = transfers[transfers["prompt_tokens"].isin(sender.index)]
    start = moved["prompt_tokens"].map(sender["end"]) + moved["transfer_wait_s"]
    sends = pd.DataFrame({"replica": moved["prompt_tokens"].map(sender["replica"]), "start": start,
                          "end": start + moved["transfer_s"]})
    shares = []
    for step in steps.itertuples():
        mine = sends[sends["replica"] == step.replica]
        inside = (np.minimum(mine["end"], step.end) - np.maximum(mine["start"], step.start)).clip(lower=0)
        shares.append(min(1.0, inside.sum() / step.duration))
    return pd.Series(shares, index=steps.index)


def cell_steps(call: Path, path: Path, transfers: pd.DataFrame, trace: str | None, graph_tokens: int,
               block_size: int) -> pd.DataFrame:
    """The cell's one-prompt prefill steps of both sides, matched (module doc)."""
    kept = read_kept(path)
    cell = {key: str(kept[key].iloc[0]) for key in CELL}
    arrival = arrivals(call, cell, trace)
    moved = transfers[(transfers["fleet"] == cell["fleet"]) & (transfers["workload"] == cell["workload"])
                      & (transfers["load"].astype(str) == cell["load"])]
    sides = []
    for side, steps in kept[kept["pool"] == "prefill"].groupby("side"):
        one = one_prompt_steps(steps, block_size)
        one = one[one["prefill_tokens"].isin(arrival.index)].drop_duplicates("prefill_tokens", keep=False)
        one = one.assign(side=side, arrival=one["prefill_tokens"].map(arrival))
        idle_at_arrival = ~(one["previous_end"] > one["arrival"])
        one["delay_s"] = (one["start"] - one["arrival"]).where(idle_at_arrival)
        one["ttft_s"] = one["end"] - one["arrival"]
        one["idle_start"] = ~(one["gap_s"] <= IDLE_S)
        one["send_overlap"] = send_overlap(one, moved) if side == MEASURED else np.nan
        sides.append(one)
    both = pd.concat(sides, ignore_index=True)
    priced = both[both["side"] != MEASURED].set_index("prefill_tokens")["duration"]
    both["priced_s"] = both["prefill_tokens"].map(priced)
    both["over_priced"] = both["duration"] / both["priced_s"]
    both["regime"] = np.where(both["prefill_tokens"] <= graph_tokens, "graph", "eager")
    columns = [*CELL, "side", "replica", "step", "regime", "prefill_tokens", "start", "duration_s", "priced_s",
               "over_priced", "idle_start", "gap_s", "delay_s", "ttft_s", "send_overlap", "held_tokens"]
    return both.rename(columns={"duration": "duration_s"})[columns]


def summary(steps: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for keys, group in steps.groupby([*CELL, "side", "regime"], sort=True):
        row = dict(zip([*CELL, "side", "regime"], keys))
        priced = group.dropna(subset=["priced_s"])
        slow = priced[priced["over_priced"] > SLOW]
        row.update(steps=len(group), idle_share=group["idle_start"].mean(),
                   measured_ms=1e3 * group["duration_s"].mean(), priced_ms=1e3 * priced["priced_s"].mean(),
                   over_priced=priced["duration_s"].sum() / priced["priced_s"].sum(),
                   excess_ms=1e3 * (priced["duration_s"] - priced["priced_s"]).mean(),
                   slow_share=len(slow) / max(1, len(priced)), slow_median_ms=1e3 * slow["duration_s"].median())
        for name, part in (("with_send", priced[priced["send_overlap"] > 0]),
                           ("without_send", priced[~(priced["send_overlap"] > 0)])):
            row[f"steps_{name}"] = len(part)
            row[f"over_priced_{name}"] = part["duration_s"].sum() / part["priced_s"].sum() if len(part) else np.nan
        delay = group["delay_s"].dropna()
        row.update(delay_p50_ms=1e3 * delay.median(), delay_p90_ms=1e3 * delay.quantile(0.9),
                   ttft_p50_ms=1e3 * group["ttft_s"].median())
        rows.append(row)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("call", type=Path, help="a `run_disagg measure --keep-steps` output folder")
    parser.add_argument("--trace", default=None, help="the conversation trace (default: settings.json's)")
    parser.add_argument("--graph-tokens", type=int, default=4096,
                        help="the engine's prefill graphs' largest size (execution.prefill_graph_tokens)")
    parser.add_argument("--block-size", type=int, default=256, help="the KV cache's block size (tokens)")
    parser.add_argument("--out", type=Path, default=None, help="write prefill_steps.csv.gz and prefill_summary.csv")
    args = parser.parse_args(argv)
    files = sorted(p for p in args.call.glob("steps_*P*D_*.csv.gz"))
    if not files or not (args.call / "transfers.csv").is_file():
        print(f"error: {args.call}: no disaggregated steps_*.csv.gz or transfers.csv "
              "(run `run_disagg measure --keep-steps`)", file=sys.stderr)
        return 2
    transfers = pd.read_csv(args.call / "transfers.csv", dtype={"load": str})
    steps = pd.concat([cell_steps(args.call, f, transfers, args.trace, args.graph_tokens, args.block_size)
                       for f in files], ignore_index=True)
    table = summary(steps)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        steps.to_csv(args.out / "prefill_steps.csv.gz", index=False, float_format="%.6g",
                     compression={"method": "gzip", "compresslevel": 9})
        table.to_csv(args.out / "prefill_summary.csv", index=False, float_format="%.4g")
    print("One-prompt prefill steps, measured against the simulated step of the same prompt (ms; module doc)\n")
    print(markdown(table, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
