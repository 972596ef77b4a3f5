"""A profiling grid's prefill rows replayed as CUDA graphs, priced by a profile's device-time fit
of such steps (gpu:prefill_graph: sim.profiled_regimes.DEVICE_PRICED_REGIMES), beside what each
row measured (gpu_s): by padded graph size, sequences and the tokens cached before each chunk.
Where a fit cannot tell a fresh prompt from one after a cached context, its knots sit between the
two and price one kind of row above what it took and the other below. --regime prefill does the
same for the grid's eager prefill rows (past the prefill graphs), priced by gpu:prefill, by token
count. No GPU needed.

    G=experiments/fidelity/code_completion_h200_r2/qwen3-0.6b
    python -m experiments.fidelity.cause.prefill_rows $G/profile.csv.gz profiles/h200/qwen3-0.6b.csv --out /tmp/rows.csv
    python -m experiments.fidelity.cause.prefill_rows experiments/fidelity/h100_leakfree/profile.csv.gz \
        experiments/fidelity/h100_leakfree/profile_model.csv --regime prefill --out /tmp/eager_rows.csv
    python -m experiments.fidelity.cause.prefill_rows $G/profile.csv.gz $G/profile_model_programs.csv.gz \
        --model qwen3-0.6b --hardware h200 --out /tmp/rows_programs.csv    # fitted with sim.prefill_programs
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from harness.config import ConfigError, load_hardware, model_spec
from sim.prefill_programs import PrefillPrograms
from sim.profiled import ProfiledCostModel
from sim.profiled_features import with_prefill_column
from sim.step_table import complete_columns, table_regimes

COLUMNS = ["graph_batch_size", "num_prefill_tokens", "num_seqs", "context_per_seq", "gpu_ms", "priced_ms", "error"]
# regime -> the column that sizes its rows (an eager step's graph_batch_size is its sequence count)
SIZE = {"prefill_graph": "graph_batch_size", "prefill": "num_prefill_tokens"}


def prefill_rows(grid: pd.DataFrame, model: ProfiledCostModel, regime: str = "prefill_graph") -> pd.DataFrame:
    """The grid's prefill-only rows of the regime (prefill_graph or prefill: eager) with a measured
    device time: each priced by the model's gpu:<regime> fit, and its error (priced / measured - 1)."""
    if regime not in SIZE:
        raise ValueError(f"regime: expected one of {sorted(SIZE)}, got {regime!r}")
    if f"gpu:{regime}" not in model.fits:
        raise ValueError(f"the profile has no device-time fit of {regime} steps (gpu:{regime})")
    if "gpu_s" not in grid.columns:
        raise ValueError("the grid has no gpu_s column (a grid of an overlapping engine records it)")
    table = complete_columns(grid)
    rows = table[(table_regimes(table) == regime) & (table["num_decode_tokens"] == 0)
                 & table["gpu_s"].notna()].copy()
    records = rows.to_dict("records")
    if model.uses_prefill_programs:  # the prefill kernel's program term (sim.prefill_programs)
        records = with_prefill_column(records, model.prefill_programs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        priced = [model.overlap_parts(row)[1] for row in records]
    rows["context_per_seq"] = rows["prefill_context_tokens"] / rows["num_seqs"]
    rows["gpu_ms"] = 1e3 * rows["gpu_s"]
    rows["priced_ms"] = 1e3 * np.asarray(priced)
    rows["error"] = rows["priced_ms"] / rows["gpu_ms"] - 1
    columns = COLUMNS if regime == "prefill_graph" else COLUMNS[1:]
    return rows[columns].sort_values([SIZE[regime], "context_per_seq", "num_seqs"]).reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("grid", type=Path, help="a profiling grid (profile.csv: rows with gpu_s)")
    p.add_argument("profile", type=Path, help="the profile (fitted coefficients) to price its rows with")
    p.add_argument("--regime", choices=sorted(SIZE), default="prefill_graph",
                   help="prefill_graph: the rows replayed as CUDA graphs; prefill: the eager rows")
    p.add_argument("--model", help="conf/model preset of the grid: needed by a profile fitted with the prefill "
                                   "kernel's programs (sim.prefill_programs), with --hardware")
    p.add_argument("--hardware", help="conf/hardware name of the grid's GPU (with --model)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        programs = None
        if args.model or args.hardware:
            if not (args.model and args.hardware):
                raise ValueError("--model and --hardware go together")
            hardware = load_hardware(args.hardware, "--hardware")
            programs = PrefillPrograms.of(model_spec({"preset": args.model}), hardware)
        model = ProfiledCostModel.load(args.profile, prefill_programs=programs)
        rows = prefill_rows(pd.read_csv(args.grid), model, args.regime)
    except (OSError, ValueError, ConfigError) as error:
        raise SystemExit(f"error: {str(error).splitlines()[0]}") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows.to_csv(args.out, index=False)
    size = SIZE[args.regime]
    summary = rows.groupby([size, rows["context_per_seq"] > 0])["error"].median().unstack()
    summary.columns = ["fresh prompts", "after a cached context"][:len(summary.columns)]
    print(f"median error of the fit's price, by {'padded graph size' if size == 'graph_batch_size' else 'tokens'}:")
    print((100 * summary).round(1).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
