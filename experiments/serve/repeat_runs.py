"""Two runs of the serving benchmark on the same requests, side by side: how far each source's
figures moved from one to the other (their repeat noise), beside the simulator server's miss.

    python -m experiments.serve.repeat_runs experiments/serve/h100_run5_aiperf experiments/serve/h100_run6_aiperf

Each argument: a folder with bench_serve's serve.csv (or the file). Per case (workload, load) and
source that both runs have (harness_run, engine_server_aiperf, ...): each figure of the second run
in percent against the first's. The simulator's server is deterministic given its arrivals, so its
rows move little; the engine's rows move with the machine (another host, a host stall). A miss of
the simulator's server smaller than the engine server's own move between two runs cannot be told
from that noise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from harness.compare.tables import markdown

FIGURES = ("ttft_p50_ms", "ttft_p90_ms", "itl_p50_ms", "itl_p90_ms")
KEYS = ["workload", "load", "source"]


def read_serve(path: Path) -> pd.DataFrame:
    """serve.csv of a bench output folder (or the file itself); SystemExit naming it if missing."""
    table = path / "serve.csv" if path.is_dir() else path
    if not table.is_file():
        raise SystemExit(f"error: {path}: no serve.csv (bench_serve's --out, or a run's committed folder)")
    return pd.read_csv(table)


def moves(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """For each (workload, load, source) in both: the second run's figures in % against the first's."""
    pair = first[KEYS + list(FIGURES)].merge(second[KEYS + list(FIGURES)], on=KEYS, suffixes=("_a", "_b"))
    out = pair[KEYS].copy()
    for figure in FIGURES:
        out[figure.removesuffix("_ms") + "_pct"] = (pair[f"{figure}_b"] / pair[f"{figure}_a"] - 1) * 100
    return out.sort_values(KEYS, kind="stable").reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="the earlier run's folder or serve.csv")
    parser.add_argument("second", type=Path, help="the later run's folder or serve.csv")
    args = parser.parse_args(argv)
    table = moves(read_serve(args.first), read_serve(args.second))
    if table.empty:
        raise SystemExit("error: the two runs share no (workload, load, source) row")
    print(markdown(table.round(1)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
