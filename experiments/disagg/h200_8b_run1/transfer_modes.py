"""The measured KV transfers of a 1P1D measure call against the simulated ones, per cell, as
quantiles: the distribution's two modes (transfers that went at once, and those whose send queued on
the prefill GPU behind the prefill step in flight) show where a median alone cannot.

    python -m experiments.disagg.h200_8b_run1.transfer_modes DIR [--run RUN] [--out CSV]

DIR: the call's folder with transfers.csv (not committed: 161 KB); RUN: its committed folder with
runs.csv and settings.json (default: this one). Each cell is simulated twice, as resim does, with
fleet.transfer.queue_behind_step false (the call's pricing) and true (engine.kv_link.BlockMover's
queue). Writes transfer_modes.csv beside this file (or CSV): per cell and side the transfer's
P10/P25/P40/P50/P60/P75/P90 in ms and the share over 50 ms.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.disagg.cells import simulate
from experiments.disagg.common import Pools, Setup
from experiments.disagg.h200_run1.resim import TRACE, call_profile
from experiments.disagg.tables import runs_path
from experiments.disagg.workloads import MEASURE_SCHEDULER, at_rate, class_workload

HERE = Path(__file__).resolve().parent
QUANTILES = (10, 25, 40, 50, 60, 75, 90)
SLOW_S = 0.05  # longer than any wire plus two decode steps here: a send that waited on a prefill step


def quantiles(side: str, cell: dict, seconds: pd.Series) -> dict:
    values = np.percentile(seconds.to_numpy() * 1e3, QUANTILES)
    return {**cell, "side": side, "n": len(seconds),
            **{f"p{q}_ms": round(float(v), 2) for q, v in zip(QUANTILES, values)},
            "share_over_50ms": round(float((seconds > SLOW_S).mean()), 3)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", help="the call's folder with transfers.csv")
    parser.add_argument("--run", default=str(HERE), help="the committed folder (runs.csv, settings.json)")
    parser.add_argument("--out", default=str(HERE / "transfer_modes.csv"))
    args = parser.parse_args(argv)
    run = Path(args.run)
    measured = pd.read_csv(Path(args.dir) / "transfers.csv", dtype={"load": str})
    runs = pd.read_csv(runs_path(run), dtype={"load": str})
    model = json.loads((run / "settings.json").read_text())["args"]["model"]
    cells = runs[(runs.side == "measured") & runs.fleet.str.fullmatch(r"\d+P\d+D")]
    rows = []
    for _, row in cells.iterrows():
        cell = {"workload": row.workload, "load": row.load}
        mine = measured[(measured.workload == row.workload) & (measured.load == row.load)]
        rows.append(quantiles("measured", cell, mine.transfer_s))
        rate = None if math.isnan(row.rate_req_s) else float(row.rate_req_s)
        workload = at_rate(class_workload(row.workload, str(TRACE), False), rate, int(row.num_requests))
        for queue in (False, True):
            setup = Setup(model, "h200", Pools.parse(row.fleet), profile=call_profile(run, model),
                          queue_behind_step=queue)
            sim = simulate(setup, setup.run_config("sim", MEASURE_SCHEDULER), "disaggregated", workload,
                           int(row.num_blocks) // int(row.replicas))
            moved = sim.requests[sim.requests["decode_replica"] >= 0]
            rows.append(quantiles(f"sim queue_behind_step={str(queue).lower()}", cell, moved.transfer_s))
    table = pd.DataFrame(rows)
    table.to_csv(args.out, index=False)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
