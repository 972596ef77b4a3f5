"""Do a served run's steps cost more the more prefill the GPU ran just before them?

A GPU held at its power limit lowers its clock (experiments/fidelity/h200_sustained: an H200's SM
clock 1,980 -> 1,695 MHz under sustained eager prefills); the profiling grid times each shape in a
burst. This prices every step of the held-out protocol's replays (fidelity.steps_dir) by a fit at
each run's measured host (sim.host_speed, as host_scales.py does) and bins each kind of step by the
prefill tokens the run computed over the --window seconds before it (on the replay's own clock: the
steps' device spans and the idle gaps between them): measured over priced time per bin. No GPU
needed.

    python -m experiments.fidelity.cause.prefill_load STEPS_DIR FIT --out prefill_load.csv
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.fidelity.cause.host_scales import REPLAY, replay_paths, replay_steps
from sim.host_speed import measured_host_scale, with_host_scale
from sim.profiled import ExtrapolationWarning, ProfiledCostModel

RATE_BINS_K = (0, 100, 150, 200, 250, 300, 400, np.inf)  # prefill tokens a second, thousands
REGIMES = ("prefill", "prefill_graph", "decode_graph")


def recent_prefill_rate(steps: pd.DataFrame, window_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(each step's end on the run's clock, prefill tokens a second over the window_s before it)."""
    ends = np.cumsum(steps["measured_execute_s"].to_numpy() + steps["measured_host_s"].to_numpy())
    tokens = np.cumsum(steps["num_prefill_tokens"].to_numpy())
    first = np.searchsorted(ends, ends - window_s)
    span = np.maximum(ends - ends[first], 1e-9)
    return ends, (tokens - tokens[first]) / span


def load_rows(path: Path, model: ProfiledCostModel, window_s: float) -> pd.DataFrame:
    """One replay's steps of REGIMES after its first window: regime, measured and priced seconds, rate."""
    match = REPLAY.search(path.name)
    if match is None:
        raise ValueError(f"{path}: not a replay (<class>_<load>_<repeat>.csv.gz)")
    steps = replay_steps(path)
    priced = with_host_scale(model, measured_host_scale(steps, model)).predict(steps)
    ends, rate = recent_prefill_rate(steps, window_s)
    table = pd.DataFrame({"load": match["load"], "regime": steps["regime"].to_numpy(),
                          "measured_s": steps["measured_execute_s"].to_numpy(), "priced_s": priced,
                          "rate_k": rate / 1e3})
    return table[(ends > window_s) & table["regime"].isin(REGIMES)]


def binned(rows: pd.DataFrame) -> pd.DataFrame:
    """Per regime and bin of the recent prefill rate: steps and measured over priced time."""
    bins = pd.cut(rows["rate_k"], RATE_BINS_K)
    grouped = rows.groupby(["regime", bins], observed=True)
    out = grouped.agg(steps=("measured_s", "size"), measured_s=("measured_s", "sum"), priced_s=("priced_s", "sum"))
    out["measured_over_priced"] = out["measured_s"] / out["priced_s"]
    return out.reset_index().rename(columns={"rate_k": "prefill_k_tokens_per_s"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps_dir", type=Path, help="a held-out call's steps/ folder (fidelity.steps_dir)")
    parser.add_argument("fit", type=Path, help="the profiled model to price the steps with")
    parser.add_argument("--window", type=float, default=1.0, help="seconds of prefill counted before a step")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        paths = replay_paths(args.steps_dir)
        if not args.window > 0:
            raise ValueError(f"--window must be > 0 seconds, got {args.window}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    model = ProfiledCostModel.load(args.fit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)  # a held-out class leaves the grid's range
        rows = pd.concat([load_rows(path, model, args.window) for path in paths], ignore_index=True)
    table = binned(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out, index=False)
    print(table.round(3).to_string(index=False))
    print("median recent prefill rate by cell, k tokens/s:", rows.groupby("load")["rate_k"].median().round(0).to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main())
