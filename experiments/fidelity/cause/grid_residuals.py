"""A fit against its own grid's rows of one regime: measured duration, the fit's price and the
residual, each row with its batch and context, and per batch the slope of the measured time in the
context against the fit's. No GPU needed.

A profile prices a decode graph step by a knot per padded batch plus one price per context token for
every batch size; where the grid's rows of a small batch rise faster with context than that, the
fit prices long contexts of few sequences short (the code_completion class's decode steps).

    python -m experiments.fidelity.cause.grid_residuals GRID.csv[.gz] FIT.csv[.gz] --regime decode_graph \
        --max-seqs 64 --out residuals.csv
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from sim.profiled import ExtrapolationWarning, ProfiledCostModel
from sim.profiled_regimes import regime_of
from sim.step_table import complete_columns


def residual_rows(grid: pd.DataFrame, model: ProfiledCostModel, regime: str, max_seqs: int) -> pd.DataFrame:
    """The grid's rows of `regime` with at most max_seqs sequences, priced by model (duration_s, the
    executor's part), sorted by batch and context."""
    table = complete_columns(grid)
    rows = table[[regime_of(r) == regime for r in table.to_dict("records")]]
    rows = rows[rows["num_seqs"] <= max_seqs]
    if rows.empty:
        raise ValueError(f"the grid has no {regime} rows of at most {max_seqs} sequences")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExtrapolationWarning)
        priced = model.predict(rows)
    out = rows[["num_seqs", "decode_context_tokens", "duration_s"]].assign(priced_s=priced)
    out["residual_s"] = out["duration_s"] - out["priced_s"]
    return out.sort_values(["num_seqs", "decode_context_tokens"]).reset_index(drop=True)


def slopes(rows: pd.DataFrame) -> pd.DataFrame:
    """Per batch size with two or more contexts: least-squares seconds per context token of the
    measured and of the priced durations."""
    out = []
    for seqs, part in rows.groupby("num_seqs"):
        if part["decode_context_tokens"].nunique() < 2:
            continue
        x = part["decode_context_tokens"].to_numpy(dtype=float)
        out.append({"num_seqs": seqs, "rows": len(part),
                    "measured_s_per_token": np.polyfit(x, part["duration_s"], 1)[0],
                    "priced_s_per_token": np.polyfit(x, part["priced_s"], 1)[0]})
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", type=Path, help="a profiling grid's raw rows (profile.csv)")
    parser.add_argument("fit", type=Path, help="the profiled model fitted on it (profile_model.csv)")
    parser.add_argument("--regime", default="decode_graph")
    parser.add_argument("--max-seqs", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        rows = residual_rows(pd.read_csv(args.grid), ProfiledCostModel.load(args.fit), args.regime, args.max_seqs)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(args.out, index=False)
    print(rows.assign(residual_us=1e6 * rows["residual_s"]).round(6).to_string(index=False))
    print(slopes(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
