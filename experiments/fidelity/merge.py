"""Merge the held-out tables of the GPU calls (run_gpu.sh) into experiments/fidelity/heldout.csv.gz,
with heldout_<model>.png per model, coverage.csv and coverage.png (per model, GPU and load: the cells
inside the propagated and the conformalised interval), targets.csv (cells within 10%) and
interval_margins.csv (the conformal margin per model, GPU and load from every class,
harness.fidelity.conformal, for intervals of new workloads; inf where a group has too few cells).
No GPU needed.
The schedules.csv found beside any of the tables (harness.fidelity.schedules) are merged the same
way into schedules.csv; tables without one (calls from before it existed) are merged as before.

    python experiments/fidelity/merge.py experiments/fidelity/calls/*/heldout.csv

A later table's rows replace an earlier one's for the same model, hardware, class, load, metric
and cost model (schedules: class, cost model and engine repeat), so a call that re-measures some
classes updates the committed tables in place:

    python experiments/fidelity/merge.py experiments/fidelity/heldout.csv.gz <the call's heldout.csv>

Where a call priced a cell at the host that served it (rows profiled_host of fidelity.price_serving_host,
or resimulate.py --host-scales rows profiled_run_host), that prediction is the cell's "profiled" row
and the prediction at the profile's host stays beside it as profiled_grid_host; columns host_scale and
host_measured say which (harness.fidelity.report.at_measured_host). The coverage, the conformal
margins and the targets read the "profiled" rows.

A call that serves committed cells again, to measure them on another machine, is pooled instead:
every call's repeats count, and engine_spread says how far the calls' means lie apart
(harness.fidelity.report.pool):

    python experiments/fidelity/merge.py experiments/fidelity/heldout.csv.gz --pool <the call's heldout.csv>
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from harness.fidelity.conformal import margins
from harness.fidelity.report import (
    LOAD_METRICS,
    at_measured_host,
    coverage_table,
    merge,
    plot_coverage,
    plot_heldout,
    pool,
    target_table,
)
from harness.fidelity.schedules import merge_schedules
from harness.scripting import one_line_errors

HERE = Path(__file__).resolve().parent


def merge_schedule_tables(tables: list[Path], out: Path) -> None:
    """schedules.csv beside the given heldout tables, in their order, merged into out/schedules.csv."""
    # several tables in one folder share one schedules.csv: read it once, at its first place
    found = dict.fromkeys(p.parent.resolve() / "schedules.csv" for p in tables)
    found = [p for p in found if p.is_file()]
    if not found:
        return
    schedules = merge_schedules([pd.read_csv(p) for p in found])
    schedules.to_csv(out / "schedules.csv", index=False)
    identical = schedules["schedule_identical"].astype(str) == "True"
    print(f"schedules: {int(identical.sum())} of {len(schedules)} offline comparisons identical")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tables", nargs="+", type=Path, help="heldout.csv of each call")
    parser.add_argument("--pool", nargs="+", type=Path, default=[],
                        help="heldout.csv of calls that served the tables' cells again: pooled, not replaced")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)

    def run() -> int:
        table = at_measured_host(merge([pd.read_csv(path) for path in args.tables]))
        if args.pool:
            table = at_measured_host(pool([table, *(at_measured_host(pd.read_csv(path)) for path in args.pool)]))
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "heldout.csv", index=False)
        for (model, hardware), part in table.groupby(["model", "hardware"]):
            plot_heldout(part, args.out / f"heldout_{model}_{hardware}.png")
        merge_schedule_tables(args.tables, args.out)
        target_table(table).to_csv(args.out / "targets.csv", index=False)
        coverage = coverage_table(table)
        coverage.to_csv(args.out / "coverage.csv", index=False)
        plot_coverage(coverage, args.out / "coverage.png")
        bounded = table[(table["cost_model"] == "profiled") & table["metric"].isin(LOAD_METRICS)
                        & table["in_interval"].notna()]
        margins(bounded).to_csv(args.out / "interval_margins.csv", index=False)
        print(coverage.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        return 0

    return one_line_errors(run)


if __name__ == "__main__":
    raise SystemExit(main())
