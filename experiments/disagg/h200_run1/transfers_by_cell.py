"""Per-cell summary of the measured KV transfers of a `run_disagg measure` call, beside the decode
replica's step period (its P50 TPOT, a proxy) and the prefill-side handshake.

    python -m experiments.disagg.h200_run1.transfers_by_cell DIR [--runs RUNS] [--out CSV]

reads DIR/transfers.csv and DIR/runs.csv (or RUNS), writes transfers_by_cell.csv beside this file
(or CSV). Any P:D mix: each cell is read against the measured run of its transfers' fleet. Columns:
per (workload, load): n; corr_bytes (Pearson, bytes against transfer_s); transfer P10/P50/P90 and
its minimum (ms); min_big_gbps (the fastest transfer among the largest quartile of prompts: a
lower bound on the wire's bandwidth); wait P10/P50 (ms: first token to the send posted, the
handshake and any back-pressure); tpot_p50_ms of the measured disaggregated run; transfer_per_step
(median transfer / tpot_p50); wire_ms (mean bytes at min_big_gbps); model_ms = wire_ms + 1.5 x
tpot_p50_ms (the wire, then the receive seen at the decode loop's next boundary, half a step on
average, then the cache write waiting for the step in flight, one step: see README.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.disagg.tables import runs_path

HERE = Path(__file__).resolve().parent


def summarise(transfers: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (fleet, workload, load), g in transfers.groupby(["fleet", "workload", "load"], sort=False):
        measured = runs[(runs.side == "measured") & (runs.fleet == fleet)].set_index(["workload", "load"])
        ms = g.transfer_s * 1e3
        big = g[g.prompt_tokens >= g.prompt_tokens.quantile(0.75)]
        gbps = float((big.transfer_bytes / big.transfer_s).max() / 1e9)
        tpot = float(measured.loc[(workload, load), "tpot_p50_s"]) * 1e3
        wire = float(g.transfer_bytes.mean()) / (gbps * 1e9) * 1e3
        rows.append({
            "workload": workload, "load": load, "n": len(g),
            "mb_mean": round(float(g.transfer_bytes.mean()) / 1e6, 1),
            "corr_bytes": round(float(np.corrcoef(g.transfer_bytes, g.transfer_s)[0, 1]), 2),
            "transfer_min_ms": round(float(ms.min()), 2),
            **{f"transfer_p{q}_ms": round(float(ms.quantile(q / 100)), 2) for q in (10, 50, 90)},
            "min_big_gbps": round(gbps, 1),
            **{f"wait_p{q}_ms": round(float(g.transfer_wait_s.quantile(q / 100)) * 1e3, 2) for q in (10, 50)},
            "tpot_p50_ms": round(tpot, 2),
            "transfer_per_step": round(float(ms.median()) / tpot, 2),
            "wire_ms": round(wire, 2),
            "model_ms": round(wire + 1.5 * tpot, 2),
        })
    return pd.DataFrame(rows)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="the measure call's $OUT/m (transfers.csv, runs.csv)")
    parser.add_argument("--runs", type=Path, help="runs.csv when not in DIR (a committed copy)")
    parser.add_argument("--out", type=Path, default=HERE / "transfers_by_cell.csv")
    args = parser.parse_args(argv)
    table = summarise(pd.read_csv(args.dir / "transfers.csv", dtype={"load": str}),
                      pd.read_csv(args.runs or runs_path(args.dir), dtype={"load": str}))
    table.to_csv(args.out, index=False)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1:])
