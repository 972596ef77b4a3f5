"""Served decode graph launches per graph size against the profile's launch fit and against the
smooth line of backend.launch_line_grid (sim.launch_line), on a bench_serve output.

    python -m experiments.serve.launch_line OUT --grid GRID [--min-steps 20]

Per graph size of the engine server's and the harness's decode graph steps (all cases together):
the steps, the median recorded launch_s, each model's price and the median ratio of launch to
price. A closing table per loop and case: the host each model measures (the median ratio over
all its decode graph steps: sim.host_speed.measured_host_scale) and the spread of the per-size
ratios (sizes with at least --min-steps steps): a smooth host factor is one whose ratios are flat.
Nothing here is fitted on the served steps: the line is the grid's (GRID, a profiling grid CSV).
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.serve import host
from experiments.serve.loop_host import cases_of, split_server
from experiments.serve.split_inputs import unpack
from experiments.serve.step_prices import SIM
from harness.compare.tables import markdown
from sim.host_speed import measured_host_scale
from sim.launch_line import load_launch_line, with_launch_line
from sim.profiled import ProfiledCostModel
from sim.profiled_regimes import regime_of
from sim.step_table import complete_columns


def priced(steps: pd.DataFrame, models: dict[str, ProfiledCostModel]) -> pd.DataFrame:
    """Decode graph steps with a launch_s: size, launch and each model's launch price."""
    table = complete_columns(steps.assign(duration_s=1.0) if "duration_s" not in steps else steps)
    rows = [row for row in table.to_dict("records")
            if regime_of(row) == "decode_graph" and row["launch_s"] == row["launch_s"]]
    out = pd.DataFrame({"size": [row["graph_batch_size"] for row in rows], "launch": [row["launch_s"] for row in rows]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # extrapolation: the steps are what they are
        for name, model in models.items():
            out[name] = [model.overlap_parts(row)[0] for row in rows]
    return out


def per_size(table: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    grouped = table.assign(**{f"{n}_ratio": table["launch"] / table[n] for n in names}).groupby("size")
    out = grouped.agg(steps=("launch", "size"), launch_ms=("launch", "median"),
                      **{f"{n}_ms": (n, "median") for n in names},
                      **{f"{n}_ratio": (f"{n}_ratio", "median") for n in names})
    for column in ["launch_ms", *[f"{n}_ms" for n in names]]:
        out[column] *= 1e3
    return out.reset_index()


def spread(table: pd.DataFrame, steps: pd.DataFrame, models: dict[str, ProfiledCostModel], min_steps: int) -> dict:
    sizes = per_size(table, list(models))
    kept = sizes[sizes["steps"] >= min_steps]
    row: dict = {}
    for name, model in models.items():
        ratios = kept[f"{name}_ratio"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            row[f"{name}_host"] = measured_host_scale(steps, model)
        row[f"{name}_min"], row[f"{name}_max"] = ratios.min(), ratios.max()
        row[f"{name}_max/min"] = ratios.max() / ratios.min()
        row[f"{name}_sd_log"] = float(np.std(np.log(ratios), ddof=1)) if len(ratios) > 1 else 0.0
    return row


def report(out: Path, grid: Path, min_steps: int) -> str:
    lines = [f"# {out}", "", f"line: {load_launch_line(grid)} (from {grid})", ""]
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = unpack(out, Path(tmp), ("harness", "engine_server"))
        plan = cases_of(folders["harness"])
        hardware = [o for o in plan[0][1] if o.startswith(("model=", "hardware="))]
        fit = host.profile_model([*SIM, *hardware])
        if fit is None:
            raise SystemExit("error: no profiled model for these cases")
        models = {"fit": fit, "line": with_launch_line(fit, load_launch_line(grid))}
        server = pd.read_csv(folders["engine_server"] / "steps.csv.gz")
        cases = split_server(server, [name for name, _ in plan])
        harness = {name: pd.read_csv(folders["harness"] / name / "steps.csv.gz") for name, _ in plan}
        for loop, whole, parts in (("engine_server", server, cases),
                                   ("harness", pd.concat(harness.values(), ignore_index=True), harness)):
            table = priced(whole, models)
            lines += [f"## {loop}, all cases", "", markdown(per_size(table, list(models)).round(3)), ""]
            summary.append({"loop": loop, "case": "all", **spread(table, whole, models, min_steps)})
            for name, steps in parts.items():
                summary.append({"loop": loop, "case": name, **spread(priced(steps, models), steps, models, min_steps)})
    lines += [f"## host and per-size ratio spread (sizes with >= {min_steps} steps)", "",
              markdown(pd.DataFrame(summary).round(3)), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a bench_serve --out folder")
    parser.add_argument("--grid", type=Path, required=True, help="the profiling grid the line is fitted on")
    parser.add_argument("--min-steps", type=int, default=20, help="sizes with fewer steps are left out of the spread")
    args = parser.parse_args(argv)
    print(report(args.out, args.grid, args.min_steps), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
