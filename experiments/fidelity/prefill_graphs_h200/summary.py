"""The prefill-graph calls side by side (call.sh; README.md says which is which): the engine's values
and its repeats' spread per cell, each cost model's error, and the grids' prefill steps, as CUDA
graphs against eager, on the device alone. No GPU needed.

    python -m experiments.fidelity.prefill_graphs_h200.summary experiments/fidelity/prefill_graphs_h200
    python -m experiments.fidelity.prefill_graphs_h200.summary DIR --extract LABEL=PROFILE ...

DIR holds one folder per call (heldout.csv.gz) and grid_prefill_rows.csv.gz, the grids' prefill rows;
--extract writes that file from the calls' full grids (profile.csv.gz, not committed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "request_s")
ROWS = "grid_prefill_rows.csv.gz"
SHAPE = ["kind", "num_prefill_tokens", "num_seqs", "prefill_context_tokens"]


def cells(folder: Path) -> pd.DataFrame:
    """Every call's loaded and offline cells: call, load, metric, cost_model, engine, spread, err."""
    parts = []
    for table in sorted(folder.glob("*/heldout.csv.gz")):
        part = pd.read_csv(table, dtype={"load": str})
        parts.append(part[part["metric"].isin(METRICS)].assign(call=table.parent.name))
    if not parts:
        raise ValueError(f"{folder}: no <call>/heldout.csv.gz")
    return pd.concat(parts)[["call", "load", "metric", "cost_model", "engine", "engine_spread", "err"]]


def extract(profiles: dict[str, Path]) -> pd.DataFrame:
    """The grids' prefill steps without decodes (fresh or after a cached context), timed on the
    device alone (gpu_s), one row per call, shape and launch (cuda_graph)."""
    rows = []
    for label, path in profiles.items():
        grid = pd.read_csv(path)
        keep = grid["kind"].isin(["prefill", "long_prefill"]) & (grid["num_decode_tokens"] == 0)
        rows.append(grid.loc[keep, SHAPE + ["cuda_graph", "gpu_s"]].assign(call=label))
    return pd.concat(rows)


def graph_over_eager(rows: pd.DataFrame) -> pd.DataFrame:
    """Per call, the one-prompt long_prefill shapes both launches ran: graph / eager device time."""
    fresh = rows[(rows["kind"] == "long_prefill") & (rows["num_seqs"] == 1)]
    wide = fresh.pivot_table(index=["num_prefill_tokens", "prefill_context_tokens"], columns=["call", "cuda_graph"],
                             values="gpu_s")
    out = {}
    for call in wide.columns.get_level_values(0).unique():
        if (call, 0) in wide and (call, 1) in wide:
            out[call] = wide[(call, 1)] / wide[(call, 0)]
    return pd.DataFrame(out).dropna(how="all")


def between_calls(rows: pd.DataFrame, before: str, after: str) -> pd.Series:
    """Every graph prefill shape both calls' grids timed: after / before, device time."""
    graphs = rows[rows["cuda_graph"] == 1].pivot_table(index=SHAPE, columns="call", values="gpu_s")
    return (graphs[after] / graphs[before]).dropna()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--extract", nargs="+", default=None, metavar="LABEL=PROFILE",
                        help="write FOLDER/grid_prefill_rows.csv.gz from these grids first")
    args = parser.parse_args(argv)
    try:
        if args.extract:
            pairs = [item.split("=", 1) for item in args.extract]
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError("--extract takes LABEL=PROFILE pairs")
            extract({label: Path(path) for label, path in pairs}).to_csv(args.folder / ROWS, index=False)
        table = cells(args.folder)
        rows = pd.read_csv(args.folder / ROWS)
    except (OSError, KeyError, ValueError) as error:
        print(f"summary: {error}", file=sys.stderr)
        return 1
    engine = table[table["cost_model"] == "profiled"]
    print("engine (s, req/s) and its repeats' spread (%):")
    wide = engine.pivot_table(index=["load", "metric"], columns="call", values=["engine", "engine_spread"])
    wide["engine_spread"] *= 100
    print(wide.round(4).to_string())
    print("\nerror (%), each call's own grid fit, at the grid's host and at each run's measured host:")
    print((100 * table[table["cost_model"].isin(["profiled_grid_host", "profiled"])]
           .pivot_table(index=["load", "metric"], columns=["cost_model", "call"], values="err")).round(1).to_string())
    print("\none-prompt prefills, graph / eager device time, per call's grid:")
    print(graph_over_eager(rows).round(3).to_string())
    if {"graphs4096", "heads_fastest"} <= set(rows["call"]):
        ratio = between_calls(rows, "graphs4096", "heads_fastest")
        print(f"\ngraph prefill shapes, heads_fastest / graphs4096 device time over {len(ratio)} shapes: "
              f"median {ratio.median():.3f}, range {ratio.min():.3f}-{ratio.max():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
