"""Re-simulate a measure call's disaggregated cells on CPU from its saved settings and runs: the
same requests (workloads.class_workload, at_rate with each cell's rate and count from runs.csv),
the measured KV blocks per replica, the H200 profile; `--set` Hydra overrides for the simulated
side (the call's own, from its settings.json, come first).

    python -m experiments.disagg.h200_run1.resim [--run DIR] [--no-handshake] [--queue-behind-step {0,1}] [--label L]

DIR: a call's folder with runs.csv and settings.json (default: this one; e.g.
experiments/disagg/h200x4_pd_mixes/measure_1P3D). Prints each cell's errors against the measured
row in runs.csv (the targets of tables.TARGETS) and writes resim_<label>.csv into DIR.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from experiments.disagg.cells import simulate
from experiments.disagg.common import Pools, Setup
from experiments.disagg.tables import TARGETS
from experiments.disagg.workloads import MEASURE_SCHEDULER, at_rate, class_workload

HERE = Path(__file__).resolve().parent
METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "request_s", "transfer_p50_s",
           "transfer_wait_p90_s")
TRACE = Path("/work/main/.traces/azure_conv_2023.csv")  # the call's (settings.json "trace")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="Hydra overrides, both sides")
    parser.add_argument("--no-handshake", action="store_true", help="price the link alone (the call's own pricing)")
    parser.add_argument("--queue-behind-step", type=int, choices=(0, 1), default=None,
                        help="fleet.transfer.queue_behind_step (default: its default)")
    parser.add_argument("--label", default=None, help="resim_<label>.csv (default: handshake, or profiled "
                        "with --no-handshake)")
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--run", default=str(HERE), help="the call's folder (runs.csv, settings.json)")
    args = parser.parse_args(argv)
    run = Path(args.run)
    runs = pd.read_csv(run / "runs.csv", dtype={"load": str})
    measured = runs[(runs.side == "measured") & runs.fleet.str.fullmatch(r"\d+P\d+D")]
    (fleet,) = set(measured.fleet)
    own = json.loads((run / "settings.json").read_text())["args"].get("overrides", [])
    queue = {} if args.queue_behind_step is None else {"queue_behind_step": bool(args.queue_behind_step)}
    setup = Setup("qwen3-0.6b", "h200", Pools.parse(fleet), profile="profiles/h200/qwen3-0.6b.csv",
                  overrides=(*own, *args.overrides), handshake=not args.no_handshake, **queue)
    sim_rc = setup.run_config("sim", MEASURE_SCHEDULER)
    rows, within, compared = [], 0, 0
    for _, row in measured.iterrows():
        base = class_workload(row.workload, args.trace, False)
        rate = None if math.isnan(row.rate_req_s) else float(row.rate_req_s)
        blocks = int(row.num_blocks) // int(row.replicas)
        sim = simulate(setup, sim_rc, "disaggregated", at_rate(base, rate, int(row.num_requests)), blocks)
        simulated = sim.summary.to_row()
        out = {"workload": row.workload, "load": row.load}
        for metric in METRICS:
            out[metric] = simulated[metric]
            out[f"{metric}_err_pct"] = round(100 * (simulated[metric] / row[metric] - 1), 1)
        for metric, target in TARGETS.items():
            if metric in row and not math.isnan(row[metric]):
                compared += 1
                within += abs(simulated[metric] / row[metric] - 1) <= target
        rows.append(out)
        print(row.workload, row.load, " ".join(f"{m} {out[m + '_err_pct']:+.1f}" for m in METRICS), flush=True)
    print(f"{within} of {compared} comparisons within target ({', '.join(TARGETS)})")
    label = args.label or ("profiled" if args.no_handshake else "handshake")
    pd.DataFrame(rows).to_csv(run / f"resim_{label}.csv", index=False)


if __name__ == "__main__":
    main()
