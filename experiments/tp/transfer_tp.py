"""TP=2 against TP=1: the engine, the roofline at each TP, and the TP=1 profile carried to TP=2.

Input: two `experiment=compare` runs of one workload (run.sh in this folder makes them on 2 x H200):
  --tp1 DIR  at tensor_parallel_size 1, with the profiled model (DIR/profile.csv, profiled inline)
  --tp2 DIR  at tensor_parallel_size 2, with the roofline
This script fits the TP=1 calibration (profile grid + the TP=1 run's steps, harness.calibration.fit) and
prices the TP=2 workload with it through sim/tp_transfer.py (the engine's
block count, graph sizes and step overlap, as in the TP=2 engine run) and writes tp_compare.csv
and tp_compare.md: output tok/s, TTFT/TPOT P50/P90 of every source, each one's error against the
engine at the same TP, and the TP=2/TP=1 throughput ratio of each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir

from harness.calibration.fit import fit_calibration
from harness.compare.study import engine_graph_sizes, sim_run_config
from harness.compare.tables import markdown
from harness.config import CONF_DIR, build_run_config
from harness.run import run_once

METRICS = ("output_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")


def calibrate_tp1(tp1: Path, out: Path) -> Path:
    """The TP=1 calibration as harness.calibration.fit makes it: the grid, plus the real TP=1 run's
    steps for the loop's work before each launch (launch_delay_s), which TP=2 no longer hides."""
    meta = json.loads((tp1 / "engine" / "engine.json").read_text())
    model = fit_calibration(pd.read_csv(tp1 / "profile.csv"), pd.read_csv(tp1 / "engine" / "steps.csv"),
                            engine_graph_sizes(meta))
    model.to_csv(out / "profile_model_tp1.csv")
    return out / "profile_model_tp1.csv"


def profiled_summary(run: Path, profile: Path, overrides: list[str], out: Path) -> dict:
    """The calibrated TP=1 profile on the engine run in `run` (its TP, block count and graphs);
    at TP > 1 through the TP transfer."""
    meta = json.loads((run / "engine" / "engine.json").read_text())
    tp = meta["engine_config"]["tensor_parallel_size"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=compare", "output.progress=false", *overrides,
                                                       f"backend.tensor_parallel_size={tp}"])
    rc = sim_run_config(build_run_config(cfg), "profiled", str(profile), meta)
    rc = dataclasses.replace(rc, sim=dataclasses.replace(rc.sim, profile_tp_size=1))
    outcome = run_once(rc, progress=False, label=f"sim profiled TP=1 -> {tp}")
    pd.DataFrame([outcome.summary.to_row()]).to_csv(out / f"sim_profiled_tp{tp}_summary.csv", index=False)
    return outcome.summary


def summary(folder: Path) -> dict:
    return pd.read_csv(folder / "summary.csv").iloc[0].to_dict()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tp1", type=Path, required=True)
    parser.add_argument("--tp2", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("overrides", nargs="*", help="the Hydra overrides both compare runs had (model=..., ...)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    profile = calibrate_tp1(args.tp1, args.out)
    sources = {
        (1, "engine"): summary(args.tp1 / "engine"),
        (1, "roofline"): summary(args.tp1 / "sim_roofline"),
        (1, "profiled"): profiled_summary(args.tp1, profile, args.overrides, args.out),
        (2, "engine"): summary(args.tp2 / "engine"),
        (2, "roofline"): summary(args.tp2 / "sim_roofline"),
        (2, "profiled (TP=1 transferred)"): profiled_summary(args.tp2, profile, args.overrides, args.out),
    }
    rows = []
    for (tp, source), values in sources.items():
        engine = sources[(tp, "engine")]
        row = {"tp": tp, "source": source, **{m: values[m] for m in METRICS}}
        if source != "engine":
            row.update({f"{m}_err": values[m] / engine[m] - 1.0 for m in METRICS})
        one = next(v for (t, s), v in sources.items() if t == 1 and s.split()[0] == source.split()[0])
        row["speedup_over_tp1"] = values["output_tok_s"] / one["output_tok_s"]
        rows.append(row)
    table = pd.DataFrame(rows)
    table.to_csv(args.out / "tp_compare.csv", index=False)
    (args.out / "tp_compare.md").write_text(markdown(table) + "\n")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))


if __name__ == "__main__":
    main()
