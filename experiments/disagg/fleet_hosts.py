"""The serving host's speed in each cell of a `run_disagg measure --keep-steps` call, read off the
engine replicas' recorded launches (sim.host_speed: decode graph steps' launch_s against the
profile's launch fit).

    python -m experiments.disagg.fleet_hosts DIR [--profile CSV] [--out CSV]

DIR: the call's folder (its steps_*.csv.gz and settings.json). The profile is --profile, else the
call's (settings.json's setup: the file where it is, else profiles/<hardware>/<model>.csv of this
tree). Writes DIR/hosts.csv (or --out): per cell (fleet, workload, load) one row per measured
(pool, replica) and one of pool "fleet" (replica -1) over all the cell's replicas' steps:

  host_scale    the median of the launch ratios (measured_host_scale); empty without decode graph steps
  host_jitter   the standard deviation of their log (measured_host_jitter)
  steps         the decode graph steps with a recorded launch
  eager_scale   the median ratio of the replica's eager prefill launches (steps past the call's
                prefill graphs) to the profile's eager launch fit; empty with fewer than MIN_EAGER_STEPS
  eager_steps   those steps

experiments/disagg/h200_run1/resim.py --hosts prices each cell at its "fleet" row's host_scale;
with --prefill-eager-bound each disaggregated cell's prefill pool at its prefill rows' eager_scale.

NOTE only decode graph steps measure the host: a disaggregated fleet's prefill replicas run none,
so their host_scale is empty and the fleet's row is its decode replicas'. eager_scale is read off
the very steps it would price (launch-bound eager prefills), so pricing with it is a bound on
what the prefill replica's own host explains, not a prediction. Its features are the kept
table's: a step's attention pairs as if its prompt tokens were split evenly over its requests,
fresh (the launch fit's pair term is under 1% of a launch). Kept files written before the
replicas recorded launches (no launch_s column) give empty rows.
"""

from __future__ import annotations

import argparse
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.disagg.kept_steps import read_kept
from sim.host_speed import launch_ratios
from sim.profiled import ProfiledCostModel

FLEET_POOL = "fleet"  # the row over all of a cell's replicas
MIN_EAGER_STEPS = 20  # fewer eager launches than this are a few steps' speed, not the host's
HOST_COLUMNS = ("fleet", "workload", "load", "pool", "replica", "host_scale", "host_jitter", "steps", "eager_scale",
                "eager_steps")


def launch_table(steps: pd.DataFrame) -> pd.DataFrame:
    """A kept table's measured decode graph steps with a recorded launch (launch_features)."""
    if "launch_s" not in steps.columns or "graph_batch_size" not in steps.columns:
        return pd.DataFrame()
    rows = steps[(steps["side"] == "measured") & (steps["graph_batch_size"] > 0) & steps["launch_s"].notna()]
    return launch_features(rows, prefill_attention_pairs=0, decode_context_tokens=rows["decode_context_tokens"],
                           decode_repeated_tokens=rows["decode_repeated_tokens"], cuda_graph=1,
                           graph_batch_size=rows["graph_batch_size"])


def eager_table(steps: pd.DataFrame, graph_tokens: int) -> pd.DataFrame:
    """A kept table's measured eager prefills (more tokens than the largest prefill graph) with a
    recorded launch, as launch_table's columns (module docstring: the pairs)."""
    if "launch_s" not in steps.columns:
        return pd.DataFrame()
    tokens = steps["prefill_tokens"] + steps["decode_tokens"]
    rows = steps[(steps["side"] == "measured") & (steps["prefill_tokens"] > 0) & (tokens > graph_tokens)
                 & steps["launch_s"].notna()]
    per_request = rows["prefill_tokens"] / rows["requests"].clip(lower=1)
    return launch_features(rows, prefill_attention_pairs=rows["requests"] * per_request * (per_request + 1) / 2,
                           decode_context_tokens=0, decode_repeated_tokens=0, cuda_graph=0, graph_batch_size=0)


def launch_features(rows: pd.DataFrame, **features: object) -> pd.DataFrame:
    """Kept rows as the step-timing table sim.host_speed reads (sim.features names; the served
    workloads carry no seeds), with the features that differ between step kinds given."""
    return pd.DataFrame({
        "pool": rows["pool"], "replica": rows["replica"], "launch_s": rows["launch_s"].astype(float),
        "num_prefill_tokens": rows["prefill_tokens"], "num_decode_tokens": rows["decode_tokens"],
        "num_seqs": rows["requests"], "prefill_context_tokens": 0, "num_seeded": 0, **features,
        "duration_s": rows["duration"],
    })


def eager_row(table: pd.DataFrame, model: ProfiledCostModel) -> dict[str, float | int]:
    """eager_scale and eager_steps of an eager_table."""
    if table.empty:
        return {"eager_scale": np.nan, "eager_steps": 0}
    ratios = launch_ratios(table, model, regime="prefill")
    return {"eager_scale": float(np.median(ratios)) if len(ratios) >= MIN_EAGER_STEPS else np.nan,
            "eager_steps": len(ratios)}


def host_row(table: pd.DataFrame, model: ProfiledCostModel) -> dict[str, float | int]:
    """host_scale, host_jitter and steps of a launch_table (NaN where it has no step)."""
    if table.empty:
        return {"host_scale": np.nan, "host_jitter": np.nan, "steps": 0}
    ratios = launch_ratios(table, model)
    logs = np.log(ratios)
    return {"host_scale": float(np.median(ratios)),
            "host_jitter": float(np.std(logs, ddof=1)) if len(logs) > 1 else 0.0, "steps": len(ratios)}


def cell_hosts(steps: pd.DataFrame, model: ProfiledCostModel, graph_tokens: int) -> list[dict]:
    """hosts.csv's rows of one cell's kept table (read_kept's, with fleet, workload and load)."""
    cell = {key: steps[key].iloc[0] for key in ("fleet", "workload", "load")}
    table, eager = launch_table(steps), eager_table(steps, graph_tokens)
    measured = steps[steps["side"] == "measured"][["pool", "replica"]].drop_duplicates()
    rows = []
    for pool, replica in measured.itertuples(index=False):
        mine, own_eager = ((t[(t["pool"] == pool) & (t["replica"] == replica)] if not t.empty else t)
                           for t in (table, eager))
        rows.append({**cell, "pool": pool, "replica": int(replica), **host_row(mine, model),
                     **eager_row(own_eager, model)})
    rows.append({**cell, "pool": FLEET_POOL, "replica": -1, **host_row(table, model), **eager_row(eager, model)})
    return rows


def call_graph_tokens(run: Path) -> int:
    """The largest prefill step the call's replicas replayed as a graph: its execution.prefill_graph_tokens
    (its --set, else the default) within the measure scheduler's token budget."""
    from experiments.disagg.workloads import MEASURE_SCHEDULER
    from harness.scripting import compose_run_config

    overrides = json.loads((run / "settings.json").read_text())["args"].get("overrides", [])
    rc = compose_run_config([*MEASURE_SCHEDULER, *overrides])
    return min(rc.sim.execution.prefill_graph_tokens, rc.scheduler.max_num_batched_tokens)


def call_profile_path(run: Path) -> Path:
    """The profile the call priced with (module docstring)."""
    setup = json.loads((run / "settings.json").read_text())["setup"]
    if "profile=None" in setup:
        raise SystemExit("error: the call priced its simulated side with the roofline model: no profile's "
                         "launch fit to read its host against; pass --profile")
    found = {key: re.search(rf"{key}='([^']*)'", setup) for key in ("profile", "hardware", "model")}
    named = found["profile"]
    if named is not None and Path(named.group(1)).is_file():
        return Path(named.group(1))
    if found["hardware"] is None or found["model"] is None:
        raise SystemExit(f"error: {run / 'settings.json'} names no profile, hardware and model; pass --profile")
    return Path("profiles") / found["hardware"].group(1) / f"{found['model'].group(1)}.csv"


def fleet_hosts(run: Path, profile: Path) -> pd.DataFrame:
    files = sorted(run.glob("steps_*.csv.gz"))
    if not files:
        raise SystemExit(f"error: {run} has no steps_*.csv.gz (run_disagg measure --keep-steps writes them)")
    model = ProfiledCostModel.load(profile)
    graph_tokens = call_graph_tokens(run)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a step past the profile's grid is priced by extrapolation
        for path in files:
            rows += cell_hosts(read_kept(path), model, graph_tokens)
    return pd.DataFrame(rows, columns=list(HOST_COLUMNS))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a measure call's folder (steps_*.csv.gz, settings.json)")
    parser.add_argument("--profile", default=None, help="the profiled model (default: the call's)")
    parser.add_argument("--out", default=None, help="the CSV to write (default: RUN/hosts.csv)")
    args = parser.parse_args(argv)
    run = Path(args.run)
    profile = Path(args.profile) if args.profile else call_profile_path(run)
    hosts = fleet_hosts(run, profile)
    out = Path(args.out) if args.out else run / "hosts.csv"
    hosts.to_csv(out, index=False, float_format="%.4f")
    print(hosts[hosts["pool"] == FLEET_POOL].to_string(index=False))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
