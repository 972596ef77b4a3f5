"""Measured against simulated steps, per replica, from `run_disagg measure --keep-steps` files: tells
slow steps apart from time lost between steps. No GPU needed.

    python -m experiments.disagg.step_report OUT_DIR_OR_STEPS_FILES [...] [--out DIR]

Per cell, pool, replica and step kind (and "all" kinds):
  steps_measured, steps_sim        the steps each side ran
  step_measured_s, step_sim_s      mean step time of each side's own steps
  step_priced_s                    the measured steps priced: the simulated side's step times of this
                                   cell, pool and kind fitted linearly on the step's shape (batch, new
                                   tokens, KV in use) and read at each measured step's shape; so
                                   step_measured_s / step_priced_s is the step pricing's error at the
                                   batches the engine ran, free of the schedules' differences
                                   (an extrapolation where the engine's batches exceed the simulation's)
  gap_measured_s, gap_sim_s        mean time the replica's device stood idle before a step of the kind
                                   (its start less the previous step's end)
  gap_busy_measured_s, gap_busy_sim_s   the same, over gaps after a step that left requests running
                                   or waiting: time lost between steps, not waiting for work
  batch_measured, batch_sim        mean requests per step

and per cell and pool, steps by kind and batch size (experiments/fidelity/step_groups.step_group):
mean step time on each side at the same batch (step_batches.csv); decode steps by their exact batch,
up to --sizes-up-to (step_sizes.csv: a cost that jumps between two batch sizes shows there); and per cell and pool that
decodes, where a TPOT error comes from (step_summary.csv, the replicas together):
  decode_over_priced        the measured decode steps' time over the same steps priced (step_priced_s)
  gap_share_measured, gap_share_sim   time lost between steps with work left, over the steps' time
  decode_s_measured, decode_s_sim     decode steps' time per replica
  batch_measured, batch_sim           requests per decode step, weighted by the step's time: a
                                      request's TPOT is this over the replica's tokens per second
                                      (Little's law), so at one arrival rate a larger batch is a
                                      longer TPOT
Written with --out. --size-range LOW HIGH also prints, per cell and pool, the quartiles of the exact
batch sizes' measured_over_sim over LOW..HIGH (sizes with --min-steps steps on each side).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.disagg.kept_steps import read_kept
from experiments.fidelity.step_groups import step_group
from harness.compare.tables import markdown

MEASURED = "measured"
CELL = ("fleet", "workload", "load")
REPLICA = (*CELL, "pool", "replica")
SHAPE = ("requests", "prefill_tokens", "decode_tokens", "kv_tokens")  # what the priced step time is fitted on


def kept_files(paths: list[Path]) -> list[Path]:
    """The kept files named, and those in the folders named (a ValueError where there are none)."""
    files = [f for p in paths for f in (sorted(p.glob("steps_*.csv.gz")) if p.is_dir() else [p])]
    missing = [str(f) for f in files if not f.is_file()]
    if not files or missing:
        raise ValueError(f"no kept steps at {missing or [str(p) for p in paths]}: "
                         "run `run_disagg measure --keep-steps` first")
    return files


def with_gaps(steps: pd.DataFrame) -> pd.DataFrame:
    """Each step's gap: its start less its replica's previous step's end (NaN for a first step; an
    overlap within the clocks' resolution reads 0), and whether that previous step left work."""
    steps = steps.sort_values([*REPLICA, "side", "start", "step"], kind="stable")
    previous = steps.groupby([*REPLICA, "side"], sort=False).shift(1)
    gap = (steps["start"] - previous["start"] - previous["duration"]).clip(lower=0.0)
    busy = (previous["running"] + previous["waiting"]) > 0
    return steps.assign(gap=gap, gap_busy=gap.where(busy))


def priced(steps: pd.DataFrame) -> pd.Series:
    """Each measured step's time at its shape by the simulated steps of its cell, pool and kind
    (least squares on SHAPE and a constant); NaN where the simulation ran no such step."""
    out = pd.Series(np.nan, index=steps.index)
    for _, group in steps.groupby([*CELL, "pool", "kind"], sort=False):
        sim, measured = group[group["side"] != MEASURED], group[group["side"] == MEASURED]
        if sim.empty or measured.empty:
            continue
        design = np.column_stack([np.ones(len(sim)), sim[list(SHAPE)].to_numpy(float)])
        coef, *_ = np.linalg.lstsq(design, sim["duration"].to_numpy(float), rcond=None)
        out[measured.index] = np.column_stack([np.ones(len(measured)), measured[list(SHAPE)].to_numpy(float)]) @ coef
    return out


def side_means(steps: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per key and side: step count, mean step time, gaps and batch; the sides as column suffixes."""
    named = steps.assign(side=np.where(steps["side"] == MEASURED, "measured", "sim"))
    table = named.groupby([*keys, "side"]).agg(steps=("duration", "size"), step=("duration", "mean"),
                                               gap=("gap", "mean"), gap_busy=("gap_busy", "mean"),
                                               batch=("requests", "mean"))
    wide = table.unstack("side")
    seconds = {"step", "gap", "gap_busy"}
    wide.columns = [f"{name}_{side}{'_s' if name in seconds else ''}" for name, side in wide.columns]
    return wide


def replica_report(steps: pd.DataFrame) -> pd.DataFrame:
    steps = with_gaps(steps)
    steps = steps.assign(step_priced=priced(steps))
    every = pd.concat([steps, steps.assign(kind="all")], ignore_index=True)
    keys = [*REPLICA, "kind"]
    table = side_means(every, keys)
    table["step_priced_s"] = every[every["side"] == MEASURED].groupby(keys)["step_priced"].mean()
    table["measured_over_sim"] = table["step_measured_s"] / table["step_sim_s"]
    table["measured_over_priced"] = table["step_measured_s"] / table["step_priced_s"]
    order = ["steps_measured", "steps_sim", "step_measured_s", "step_sim_s", "step_priced_s", "measured_over_sim",
             "measured_over_priced", "gap_measured_s", "gap_sim_s", "gap_busy_measured_s", "gap_busy_sim_s",
             "batch_measured", "batch_sim"]
    return table[[c for c in order if c in table.columns]].reset_index()


def batch_report(steps: pd.DataFrame) -> pd.DataFrame:
    """Per cell, pool and step group (decode by batch size): mean step time on each side."""
    grouped = steps.assign(group=step_group(steps.rename(columns={"requests": "num_seqs"}).assign(cuda_graph=0)))
    grouped = grouped.assign(group=grouped["group"].str.replace("prefill, eager", "prefill or mixed"),
                             gap=np.nan, gap_busy=np.nan)
    table = side_means(grouped, [*CELL, "pool", "group"])
    table = table[["steps_measured", "steps_sim", "step_measured_s", "step_sim_s"]]
    table["measured_over_sim"] = table["step_measured_s"] / table["step_sim_s"]
    return table.reset_index()


def size_report(steps: pd.DataFrame, up_to: int) -> pd.DataFrame:
    """Per cell, pool and exact batch up to up_to: decode steps and their mean time on each side."""
    decode = steps[(steps["kind"] == "decode") & (steps["requests"] <= up_to)].assign(gap=np.nan, gap_busy=np.nan)
    table = side_means(decode, [*CELL, "pool", "requests"])
    table = table[["steps_measured", "steps_sim", "step_measured_s", "step_sim_s"]]
    table["measured_over_sim"] = table["step_measured_s"] / table["step_sim_s"]
    return table.reset_index()


def size_range(sizes: pd.DataFrame, low: int, high: int, min_steps: int) -> pd.DataFrame:
    """Per cell and pool, over the exact batch sizes low..high (size_report's rows) with at least
    min_steps steps on each side: how many sizes, and the quartiles of measured_over_sim."""
    chosen = sizes[sizes["requests"].between(low, high) & (sizes["steps_measured"] >= min_steps)
                   & (sizes["steps_sim"] >= min_steps)]
    ratio = chosen.groupby([*CELL, "pool"])["measured_over_sim"]
    return pd.DataFrame({"sizes": ratio.size(), "p25": ratio.quantile(0.25), "p50": ratio.median(),
                         "p75": ratio.quantile(0.75)}).reset_index()


def summary_report(steps: pd.DataFrame) -> pd.DataFrame:
    """Per cell and decoding pool, the replicas together: slow steps, lost time, batch (module doc)."""
    steps = with_gaps(steps)
    steps = steps.assign(step_priced=priced(steps))
    rows = []
    for keys, group in steps[steps["pool"] != "prefill"].groupby([*CELL, "pool"], sort=True):
        row = dict(zip((*CELL, "pool"), keys))
        for side, mine in (("measured", group[group["side"] == MEASURED]), ("sim", group[group["side"] != MEASURED])):
            decode = mine[mine["kind"] == "decode"]
            replicas = max(1, mine["replica"].nunique())
            row[f"decode_s_{side}"] = decode["duration"].sum() / replicas
            row[f"batch_{side}"] = (decode["requests"] * decode["duration"]).sum() / decode["duration"].sum()
            row[f"gap_share_{side}"] = mine["gap_busy"].sum() / mine["duration"].sum()
            if side == "measured":
                row["decode_over_priced"] = decode["duration"].sum() / decode["step_priced"].sum()
        rows.append(row)
    order = [*CELL, "pool", "decode_over_priced", "gap_share_measured", "gap_share_sim", "decode_s_measured",
             "decode_s_sim", "batch_measured", "batch_sim"]
    return pd.DataFrame(rows, columns=order)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="measure results folders or steps_*.csv.gz files")
    parser.add_argument("--out", type=Path, default=None, help="write the tables here (module doc)")
    parser.add_argument("--sizes-up-to", type=int, default=64, help="step_sizes.csv: decode batches up to this")
    parser.add_argument("--size-range", type=int, nargs=2, default=None, metavar=("LOW", "HIGH"),
                        help="also print, per cell and pool, the quartiles of measured over simulated step "
                             "time over the decode batch sizes LOW..HIGH with --min-steps on each side")
    parser.add_argument("--min-steps", type=int, default=10, help="--size-range: steps a size needs on each side")
    args = parser.parse_args(argv)
    if args.size_range is not None and not 1 <= args.size_range[0] <= args.size_range[1]:
        parser.error(f"--size-range needs 1 <= LOW <= HIGH, got {args.size_range}")
    try:
        steps = pd.concat([read_kept(f) for f in kept_files(args.paths)], ignore_index=True)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    replicas, batches, summary = replica_report(steps), batch_report(steps), summary_report(steps)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        tables = {"step_report": replicas, "step_batches": batches, "step_summary": summary,
                  "step_sizes": size_report(steps, args.sizes_up_to)}
        for name, table in tables.items():
            table.to_csv(args.out / f"{name}.csv", index=False, float_format="%.6g")  # microseconds of a step
    print("Per replica and step kind: measured against simulated (step_priced_s: the measured steps at "
          "the simulation's prices; seconds)\n")
    print(markdown(replicas, 4))
    print("\nBy step group (decode by batch size), per pool: mean step time\n")
    print(markdown(batches, 4))
    print("\nPer decoding pool: decode steps against their price, time lost between steps, batch\n")
    print(markdown(summary, 4))
    if args.size_range is not None:
        low, high = args.size_range
        print(f"\nDecode batch sizes {low}-{high} (at least {args.min_steps} steps a side): measured over "
              "simulated step time, quartiles over the sizes\n")
        print(markdown(size_range(size_report(steps, high), low, high, args.min_steps), 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
