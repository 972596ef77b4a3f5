"""Where a served call ran its GPU: nvidia-smi's samples cut into busy stretches.

A fidelity call serves its cells one after another with the simulations between them, which leave
the GPU idle; a sampler beside the call (`nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,
temperature.gpu --format=csv,noheader,nounits -lms 100 > clocks.csv`) then shows each cell as a
stretch of draw between idle gaps. Per stretch: its length, the mean SM clock and draw, and the
share of samples at the power limit (within 2% of it), so a cell's steps can be read against the
clock they ran at (sim.power_limit). --labels names the stretches in order (the protocol's order:
the unmeasured warm-up drain, the drains, then each load's repeats).

    python -m experiments.fidelity.clock_segments clocks.csv --limit-w 700 --labels warmup offline 0.5 0.8 0.95
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

IDLE_W = 150.0  # an idle H100 / H200 with its model loaded draws 70-125 W (clocks.csv)
IDLE_GAP_S = 4.0  # idle this long ends a stretch; the loop's own pauses between steps are shorter
AT_LIMIT = 0.98


def read_samples(path: Path) -> pd.DataFrame:
    """t_s (from the first sample), mhz, w of an nvidia-smi CSV (timestamp, SM clock, draw, temperature)."""
    table = pd.read_csv(path, header=None, names=["timestamp", "mhz", "w", "temp_c"], skipinitialspace=True)
    when = pd.to_datetime(table["timestamp"].str.strip(), format="%Y/%m/%d %H:%M:%S.%f")
    return pd.DataFrame({"t_s": (when - when.iloc[0]).dt.total_seconds(), "mhz": table["mhz"].astype(float),
                         "w": table["w"].astype(float)})


def stretches(samples: pd.DataFrame, limit_w: float) -> pd.DataFrame:
    """One row per busy stretch: start_s, seconds, mean_mhz, mean_w, at_limit (share of samples)."""
    busy = samples[samples["w"] >= IDLE_W]
    if busy.empty:
        raise ValueError(f"no sample draws {IDLE_W:.0f} W or more: the GPU never ran")
    stretch = (busy["t_s"].diff() > IDLE_GAP_S).cumsum()
    rows = [{"start_s": round(g["t_s"].iloc[0], 1), "seconds": round(g["t_s"].iloc[-1] - g["t_s"].iloc[0], 1),
             "mean_mhz": round(g["mhz"].mean()), "mean_w": round(g["w"].mean()),
             "at_limit": round(float((g["w"] >= AT_LIMIT * limit_w).mean()), 3)}
            for _, g in busy.groupby(stretch)]
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("clocks", type=Path, help="nvidia-smi's samples (module docstring)")
    parser.add_argument("--limit-w", type=float, required=True, help="the GPU's power limit (nvidia-smi -q -d POWER)")
    parser.add_argument("--labels", nargs="*", default=[], help="names of the stretches, in order")
    parser.add_argument("--out", type=Path, help="write the stretches as CSV here too")
    args = parser.parse_args(argv)
    try:
        table = stretches(read_samples(args.clocks), args.limit_w)
    except (OSError, KeyError, ValueError) as error:
        print(f"clock_segments: {error}", file=sys.stderr)
        return 1
    if args.labels and len(args.labels) != len(table):
        print(f"clock_segments: {len(args.labels)} labels for {len(table)} stretches:\n{table.to_string()}",
              file=sys.stderr)
        return 1
    table.insert(0, "stretch", args.labels or range(len(table)))
    if args.out:
        table.to_csv(args.out, index=False)
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
