"""The engine against itself: run 10's second call over its first, cell by cell (README.md).

    python -m experiments.disagg.h200_06b_run10.repeat [FIRST SECOND]

Prints, per measured cell, each latency percentile's and the throughput's second / first - 1 (%),
and each call's rate (the loaded cells' rates follow each call's own drain).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from experiments.disagg.tables import runs_path

HERE = Path(__file__).resolve().parent
METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "request_s", "transfer_p50_s")
KEYS = ["fleet", "workload", "load"]


def repeat(first: Path, second: Path) -> pd.DataFrame:
    """second / first - 1 in %, per measured cell and metric, with both calls' rates."""
    sides = [pd.read_csv(runs_path(c), dtype={"load": str}).query("side == 'measured'").set_index(KEYS)
             for c in (first, second)]
    table = (100 * (sides[1][list(METRICS)] / sides[0][list(METRICS)] - 1)).round(1)
    return table.assign(rate_first=sides[0]["rate_req_s"], rate_second=sides[1]["rate_req_s"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calls", nargs="*", type=Path, default=[HERE / "first", HERE / "second"])
    args = parser.parse_args(argv)
    if len(args.calls) != 2:
        parser.error("two calls: the first, then its repeat")
    print(repeat(*args.calls).to_string())


if __name__ == "__main__":
    main()
