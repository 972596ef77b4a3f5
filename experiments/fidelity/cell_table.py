"""The held-out cells of some tables as one markdown table: per model, GPU, cost model and load, the
error of TTFT and TPOT P50/P90 (offline: throughput, TTFT P50, TPOT P50) with the engine's own
spread between its repeats beside each, how many of the cell's metrics its prediction interval
holds, and the same widened by the conformal margin of its model, GPU and load for new workloads
(merge.py's interval_margins.csv, harness.fidelity.conformal; a file of one margin per model, as
merge.py wrote before, is read per model; an infinite margin says too few cells). --bound
COST_MODEL=FRACTION marks whether every TTFT/TPOT P50/P90 of a load cell is within the bound. No
GPU needed.

    python experiments/fidelity/cell_table.py experiments/fidelity/code_completion_h200/*/heldout_h200.csv \
        --bound carried=0.15 profiled=0.10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from harness.convert import ConfigError
from harness.fidelity.conformal import GROUP
from harness.fidelity.report import PLOTTED
from harness.scripting import one_line_errors

HERE = Path(__file__).resolve().parent
OFFLINE = ("request_s", "ttft_p50_s", "tpot_p50_s")
HEADER = ("TTFT P50", "TTFT P90", "TPOT P50", "TPOT P90")
OFFLINE_HEADER = ("throughput", "TTFT P50", "TPOT P50", "")


def bounds(pairs: list[str]) -> dict[str, float]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            out[name] = float(value) if sep and name else float("nan")
        except ValueError:
            out[name] = float("nan")
        if not np.isfinite(out[name]):
            raise ConfigError(f"--bound: expected COST_MODEL=FRACTION, got {pair!r}")
    return out


def _percent(value: float) -> str:
    return "" if not np.isfinite(value) else f"{100 * value:+.1f}%"


def _inside(cells: pd.DataFrame, margin: float) -> str:
    bounded = cells.dropna(subset=["sim_lo", "sim_hi"])
    if bounded.empty:
        return ""
    lo, hi, engine = (bounded[c].astype(float) for c in ("sim_lo", "sim_hi", "engine"))
    plain = int(((lo <= engine) & (engine <= hi)).sum())
    if np.isinf(margin):
        return f"{plain}/{len(bounded)}, too few cells"
    if not np.isfinite(margin):
        return f"{plain}/{len(bounded)}"
    widened = int(((lo * np.exp(-margin) <= engine) & (engine <= hi * np.exp(margin))).sum())
    return f"{plain}/{len(bounded)}, {widened}/{len(bounded)}"


def read_margins(path: Path) -> dict[tuple[str, ...], float]:
    """The conformal margins of interval_margins.csv keyed by the group columns it has (of model,
    GPU and load; loads as the tables write them)."""
    table = pd.read_csv(path, dtype={"load": str})
    keys = [c for c in GROUP if c in table.columns]
    if "model" not in keys or "conformal_margin" not in table.columns:
        raise ConfigError(f"--margins: {path} needs columns model and conformal_margin, has {list(table.columns)}")
    return {tuple(str(v) for v in row[keys]): float(row["conformal_margin"]) for _, row in table.iterrows()}


def _margin_of(margins: dict[tuple[str, ...], float], model: str, hardware: str, load: str) -> float:
    for key in ((model, hardware, load), (model,)):
        if key in margins:
            return margins[key]
    return float("nan")


def rows(table: pd.DataFrame, margins: dict[tuple[str, ...], float], limits: dict[str, float]) -> list[str]:
    """The markdown rows of the table's cells, one per model, GPU, cost model, class (a table of
    several classes; blank where it has no workload column) and load; margins keyed by (model, GPU,
    load) or by (model,)."""
    out = []
    table = table.assign(load=table["load"].astype(str),
                         workload=table["workload"].astype(str) if "workload" in table.columns else "")
    for (model, hardware, cost_model, workload, load), cell in table.groupby(
            ["model", "hardware", "cost_model", "workload", "load"], sort=False):
        metrics = OFFLINE if load == "offline" else PLOTTED
        by_metric = cell.set_index("metric")
        shown = [f"{_percent(by_metric.at[m, 'err'])} ({100 * by_metric.at[m, 'engine_spread']:.1f}%)"
                 if m in by_metric.index else "" for m in metrics] + [""] * (4 - len(metrics))
        limit = limits.get(cost_model, float("nan"))
        met = ""
        if load != "offline" and np.isfinite(limit):
            met = "yes" if bool((by_metric.loc[list(PLOTTED), "err"].abs() <= limit).all()) else "no"
        bounded = cell[cell["metric"].isin(metrics)]
        out.append(f"| {model} | {hardware} | {cost_model} | {workload} | {load} | " + " | ".join(shown)
                   + f" | {met} | {_inside(bounded, _margin_of(margins, model, hardware, load))} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", type=Path, help="held-out tables (heldout.csv's columns)")
    parser.add_argument("--bound", nargs="*", default=[], help="COST_MODEL=FRACTION: the target of a cost model")
    parser.add_argument("--margins", type=Path, default=HERE / "interval_margins.csv",
                        help="conformal margins per model, GPU and load (merge.py's interval_margins.csv)")
    parser.add_argument("--cost-models", default=None, help="comma-separated cost models to show (default: all)")
    args = parser.parse_args(argv)

    def run() -> int:
        limits = bounds(args.bound)
        table = pd.concat([pd.read_csv(path) for path in args.tables], ignore_index=True)
        if args.cost_models:
            table = table[table["cost_model"].isin(args.cost_models.split(","))]
        margins = read_margins(args.margins)
        print("| model | GPU | cost model | class | load | " + " | ".join(HEADER)
              + " | within bound | in interval (90%, conformal) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        print("| | | | | offline: | " + " | ".join(OFFLINE_HEADER) + " | | |")
        print("\n".join(rows(table, margins, limits)))
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    sys.exit(main())
