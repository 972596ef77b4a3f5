"""Decode steps that stall, from `run_disagg measure --keep-steps` files: per cell and decoding
replica, the measured decode steps longer than --min-s (a decode step of these models takes 5-12
ms; a stall lasts about one or two of a prefill replica's steps), their count, time and share of
the replica's decode time, how much of each stall was the host's (`launch_s`, the step's submit),
the mean decode step with and without them beside the simulated one, and which prefill steps were
running when each stall began.

    python -m experiments.disagg.decode_stalls STEPS.csv.gz [...] [--min-s 0.1] [--out stalls.csv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from experiments.disagg.kept_steps import read_kept


def stalls(path: Path, min_s: float) -> pd.DataFrame:
    """One row per decoding replica of the cell in path (steps_<fleet>_<workload>_<load>.csv.gz)."""
    steps = read_kept(path)
    measured, simulated = steps[steps.side == "measured"], steps[steps.side != "measured"]
    prefills = measured[measured.pool == "prefill"]
    rows = []
    for replica, decode in measured[measured.kind == "decode"].groupby("replica"):
        if (decode.pool != "decode").all():  # an aggregated fleet's replica
            continue
        slow = decode[decode.duration > min_s]
        sim = simulated[(simulated.kind == "decode") & (simulated.replica == replica)]
        running = [int(((prefills.start <= s) & (prefills.start + prefills.duration > s)).sum()) for s in slow.start]
        rows.append({"cell": f"{decode.fleet.iat[0]} {decode.workload.iat[0]} {decode.load.iat[0]}", "replica": replica,
                     "decode_steps": len(decode), "stalls": len(slow), "stall_s": slow.duration.sum(),
                     "stall_share": slow.duration.sum() / decode.duration.sum(),
                     "stall_host_share": (slow.launch_s.sum() / slow.duration.sum()
                                          if len(slow) and "launch_s" in slow else float("nan")),
                     "longest_s": slow.duration.max() if len(slow) else 0.0,
                     "step_measured_s": decode.duration.mean(),
                     "step_measured_without_s": decode[decode.duration <= min_s].duration.mean(),
                     "step_sim_s": sim.duration.mean() if len(sim) else float("nan"),
                     "prefill_steps_running": " ".join(map(str, running))})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="steps_*.csv.gz files of kept steps")
    parser.add_argument("--min-s", type=float, default=0.1, help="a decode step longer than this is a stall")
    parser.add_argument("--out", type=Path, help="also write the table here (CSV)")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.is_file()]
    if missing:
        print(f"decode_stalls: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        table = pd.concat([stalls(p, args.min_s) for p in args.paths], ignore_index=True)
    except ValueError as error:
        print(f"decode_stalls: {error}", file=sys.stderr)
        return 2
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.out is not None:
        table.to_csv(args.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
