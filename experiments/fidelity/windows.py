"""Where each cell's TPOT goes, engine against simulator: the held-out protocol's
<class>_<load>_windows.csv files (harness.fidelity.windows, written beside the step replays with
fidelity.steps_dir / STEPS=1). Per cell, the engine's runs averaged, then each simulated run's
relative difference: TPOT P50, the TPOT of the requests around P50 split into prefill, decode and
other seconds per output token, the prefill and decode steps in their windows, and the run's
steps by kind. A TPOT error whose prefill steps per window agree is the steps' prices (see
step_groups.py --detail on the replays); one whose counts differ is the schedule. No GPU needed.

    python experiments/fidelity/windows.py STEPS_DIR [--workload code_completion]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

SHOWN = ("tpot_p50_s", "p50_tpot_prefill_s", "p50_tpot_decode_s", "p50_tpot_other_s", "p50_prefill_steps",
         "p50_decode_steps", "prefill_steps", "prefill_step_mean_s", "decode_steps", "decode_step_mean_s",
         "prefill_tokens_per_step")


def cell_comparison(windows: pd.DataFrame) -> pd.DataFrame:
    """The engine's runs' mean (row "engine") and each simulated run's (sim - engine) / engine."""
    engine = windows[windows["run"].str.startswith("engine")]
    if engine.empty:
        raise ValueError("a windows file without engine runs")
    mean = engine[list(SHOWN)].mean()
    rows = {"engine": mean}
    for _, sim in windows[windows["run"].str.startswith("sim")].iterrows():
        rows[f"{sim['run']} err"] = sim[list(SHOWN)].astype(float) / mean - 1.0
    return pd.DataFrame(rows).T


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps_dir", type=Path,
                        help="a fidelity.steps_dir (run_gpu.sh STEPS=1: <OUT>/<model>/<tag>/steps)")
    parser.add_argument("--workload", default=None, help="one class's cells only")
    args = parser.parse_args(argv)
    files = sorted(args.steps_dir.glob(f"{args.workload or '*'}_*_windows.csv"))
    if not files:
        print(f"error: {args.steps_dir} holds no *_windows.csv (a fidelity run with fidelity.steps_dir writes them)",
              file=sys.stderr)
        return 2
    for path in files:
        print(path.name.removesuffix("_windows.csv"))
        print(cell_comparison(pd.read_csv(path)).to_string(float_format=lambda v: f"{v:.4g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
