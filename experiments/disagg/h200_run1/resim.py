"""Re-simulate a measure call's disaggregated cells on CPU from its saved settings and runs: the
same requests (workloads.class_workload, at_rate with each cell's rate and count from runs.csv),
the measured KV blocks per replica, the H200 profile; `--set` Hydra overrides for the simulated
side (the call's own, from its settings.json, come first).

    python -m experiments.disagg.h200_run1.resim [--run DIR] [--no-handshake] [--queue-behind-step {0,1}]
        [--aggregated] [--set OVERRIDE ...] [--profile CSV] [--label L] [--out CSV]

DIR: a call's folder with runs.csv (or runs.csv.gz) and settings.json (default: this one; e.g.
experiments/disagg/h200x4_pd_mixes/measure_1P3D). Prints each cell's errors against the measured
row in runs.csv (the targets of tables.TARGETS) and writes resim_<label>.csv into DIR (or --out).
--profile: the profiled model both fleets are priced with (default: the call's own, call_profile; another
fit of the same GPU, e.g. a fresh grid's, to weigh one fit against another). The model is the call's.
--aggregated: the aggregated fleet's cells too (fleet column), as cells.simulate prices them.
--keep-steps DIR2: per cell, the call's measured steps (DIR's steps_*.csv.gz from `measure
--keep-steps`) beside the re-simulated ones, in DIR2, for experiments/disagg/step_report.py.
--hosts CSV: the call's measured host speeds (experiments/disagg/fleet_hosts.py's hosts.csv); each
cell is priced with backend.host_scale at its own fleet row's host_scale, one factor for all of the
cell's replicas (replacing any backend.host_scale of the overrides); a cell without one keeps them.
--prefill-eager-bound (with --hosts): each disaggregated cell's prefill pool priced at its prefill
rows' eager_scale (fleet.prefill.host_scale), the speed its own eager prefills launched at: a bound
on what that replica's host explains, read off the steps it prices (fleet_hosts.py's NOTE).
--interval DRAWS: each cell's 90% prediction intervals (harness.fidelity.fleet_interval) and, per
latency, whether the measured figure lies inside (<metric>_lo, _hi, _inside; experiments/disagg/intervals.py
counts them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from pathlib import Path

import pandas as pd

from experiments.disagg.cells import simulate, simulate_with_interval
from experiments.disagg.common import Pools, Setup, profile_for
from experiments.disagg.kept_steps import STEP_COLUMNS, kept_name, read_kept, side_steps
from experiments.disagg.tables import TARGETS, runs_path
from experiments.disagg.workloads import MEASURE_SCHEDULER, at_rate, class_workload
from harness.config import RunConfig
from harness.output.metrics import SUMMARY_STEP_COLUMNS
from sim.interval import INTERVAL_METRICS, IntervalConfig

HERE = Path(__file__).resolve().parent
METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "request_s", "transfer_p50_s",
           "transfer_wait_p90_s", "output_tok_s")
TRACE = Path("/work/main/.traces/azure_conv_2023.csv")  # the call's (settings.json "trace")
PROFILE = "profiles/h200/qwen3-0.6b.csv"  # the Qwen3-0.6B calls' own (settings.json)


def call_profile(run: Path, model: str) -> str:
    """The profile the call priced its simulated side with: the shipped profiles/h200/<model>.csv, else
    the H100 one carried to the H200 (common.profile_for, as the call did; written under a scratch folder
    of the system's temporary directory, the same file every time)."""
    import tempfile

    shipped = Path("profiles") / "h200" / f"{model}.csv"
    if shipped.is_file():
        return str(shipped)
    scratch = Path(tempfile.gettempdir()) / "disagg_resim_profiles"
    scratch.mkdir(exist_ok=True)
    return profile_for("h200", model, scratch)[0]


def recorded_queue(run: Path) -> bool:
    """fleet.transfer.queue_behind_step as the call priced it (its settings.json's setup); calls made before
    the option existed priced without it."""
    match = re.search(r"queue_behind_step=(True|False)", json.loads((run / "settings.json").read_text())["setup"])
    return match is not None and match.group(1) == "True"


def recorded_receive_side(run: Path) -> bool:
    """Whether the call priced the engine's receive side (Setup.receive_side); calls made before the
    setting priced without it."""
    return "receive_side=True" in json.loads((run / "settings.json").read_text())["setup"]


def recorded_hardware(run: Path) -> str:
    """The GPU (conf/hardware name) the call served on, from its settings.json's setup; the H200,
    where every committed call ran, for a setup that does not name it."""
    match = re.search(r"hardware='([^']+)'", json.loads((run / "settings.json").read_text())["setup"])
    return "h200" if match is None else match.group(1)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="Hydra overrides, both sides")
    parser.add_argument("--no-handshake", action="store_true", help="price the link alone (the call's own pricing)")
    parser.add_argument("--queue-behind-step", type=int, choices=(0, 1), default=None,
                        help="fleet.transfer.queue_behind_step (default: the call's own, recorded_queue)")
    parser.add_argument("--receive-side", type=int, choices=(0, 1), default=None,
                        help="price the engine's receive side (common.receive_side_link; default: the call's own, "
                        "recorded_receive_side; never with --no-handshake)")
    parser.add_argument("--label", default=None, help="resim_<label>.csv (default: handshake, or profiled "
                        "with --no-handshake)")
    parser.add_argument("--trace", default=str(TRACE))
    parser.add_argument("--run", default=str(HERE), help="the call's folder (runs.csv, settings.json)")
    parser.add_argument("--aggregated", action="store_true", help="the aggregated fleet's cells too")
    parser.add_argument("--out", default=None, help="the CSV to write (default: DIR/resim_<label>.csv)")
    parser.add_argument("--profile", default=None,
                        help="the profiled model that prices both fleets (default: the call's)")
    parser.add_argument("--keep-steps", default=None, help="a folder for each cell's steps, measured and re-simulated")
    parser.add_argument("--hosts", default=None, help="hosts.csv (experiments/disagg/fleet_hosts.py): each cell "
                        "priced at its fleet's measured host_scale")
    parser.add_argument("--prefill-eager-bound", action="store_true", help="with --hosts: each disaggregated "
                        "cell's prefill pool at its own eager prefills' launch speed (a bound)")
    parser.add_argument("--interval", type=int, default=None, metavar="DRAWS",
                        help="each cell's 90%% prediction intervals from DRAWS perturbed runs (sim.interval, a "
                        "pool's machines drawn together) and whether the measured latency falls inside")
    args = parser.parse_args(argv)
    if args.prefill_eager_bound and not args.hosts:
        parser.error("--prefill-eager-bound reads the prefill pool's eager_scale from --hosts")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    run = Path(args.run)
    runs = pd.read_csv(runs_path(run), dtype={"load": str})
    disaggregated = runs.fleet.str.fullmatch(r"\d+P\d+D")
    measured = runs[(runs.side == "measured") & (disaggregated | args.aggregated)]
    (fleet,) = set(runs.fleet[disaggregated])
    settings = json.loads((run / "settings.json").read_text())["args"]
    own = [*settings.get("overrides", []), *settings.get("sim_overrides", [])]
    model = settings.get("model", "qwen3-0.6b")
    queue = recorded_queue(run) if args.queue_behind_step is None else bool(args.queue_behind_step)
    receive = recorded_receive_side(run) if args.receive_side is None else bool(args.receive_side)
    setup = Setup(model, recorded_hardware(run), Pools.parse(fleet), profile=args.profile or call_profile(run, model),
                  overrides=(*own, *args.overrides), handshake=not args.no_handshake, queue_behind_step=queue,
                  receive_side=receive and not args.no_handshake)
    sim_rc = setup.run_config("sim", MEASURE_SCHEDULER)
    hosts = cell_host_scales(Path(args.hosts)) if args.hosts else None
    prefill_hosts = cell_host_scales(Path(args.hosts), "prefill", "eager_scale") if args.prefill_eager_bound else {}
    keep = Path(args.keep_steps) if args.keep_steps else None
    rows, within, compared = [], 0, 0
    for _, row in measured.iterrows():
        mode = "disaggregated" if row.fleet == fleet else "aggregated"
        rate = None if math.isnan(row.rate_req_s) else float(row.rate_req_s)
        workload = at_rate(class_workload(row.workload, args.trace, False), rate, int(row.num_requests))
        columns = tuple(dict.fromkeys((*SUMMARY_STEP_COLUMNS, *STEP_COLUMNS))) if keep else SUMMARY_STEP_COLUMNS
        cell_setup, cell_rc, scale = (setup, sim_rc, math.nan) if hosts is None else \
            at_cell_hosts(setup, sim_rc, (row.fleet, row.workload, row.load), mode, hosts, prefill_hosts)
        blocks = int(row.num_blocks) // int(row.replicas)
        sim = (simulate(cell_setup, cell_rc, mode, workload, blocks, step_columns=columns) if args.interval is None
               else simulate_with_interval(cell_setup, cell_rc, mode, workload, blocks,
                                           IntervalConfig(draws=args.interval), columns))
        simulated = sim.summary.to_row()
        out = {"fleet": row.fleet, "workload": row.workload, "load": row.load}
        if hosts is not None:
            out["host_scale"] = scale
        if args.prefill_eager_bound:
            out["prefill_host_scale"] = cell_setup.prefill_host_scale
        for metric in METRICS:
            out[metric] = simulated.get(metric, math.nan)
            out[f"{metric}_err_pct"] = round(100 * (out[metric] / row[metric] - 1), 1)
        if args.interval is not None:
            out.update(interval_hits(simulated, row))
        for metric, target in TARGETS.items():
            if metric in row and not math.isnan(row[metric]):
                compared += 1
                within += abs(simulated[metric] / row[metric] - 1) <= target
        rows.append(out)
        print(row.fleet, row.workload, row.load, " ".join(f"{m} {out[m + '_err_pct']:+.1f}" for m in METRICS),
              flush=True)
        if keep is not None:
            keep_cell(run, keep, dict(out), sim, sim_rc.cache.block_size)
    print(f"{within} of {compared} comparisons within target ({', '.join(TARGETS)})")
    label = args.label or ("profiled" if args.no_handshake else "handshake")
    pd.DataFrame(rows).to_csv(args.out or run / f"resim_{label}.csv", index=False)


def at_cell_hosts(setup: Setup, sim_rc: RunConfig, cell: tuple[str, str, str], mode: str, hosts: dict,
                  prefill_hosts: dict) -> tuple[Setup, RunConfig, float]:
    """The cell's setup and run config at its fleet's measured host (and, for a disaggregated cell
    with one, its prefill pool at its own eager launch speed), and that host scale."""
    cell_setup, scale = at_host(setup, hosts.get(cell, math.nan))
    prefill_scale = prefill_hosts.get(cell, math.nan)
    if mode == "disaggregated" and prefill_scale > 0:
        cell_setup = dataclasses.replace(cell_setup, prefill_host_scale=round(prefill_scale, 4))
    cell_rc = cell_setup.run_config("sim", MEASURE_SCHEDULER) if cell_setup is not setup else sim_rc
    return cell_setup, cell_rc, scale


def interval_hits(simulated: dict, measured: pd.Series) -> dict:
    """Each interval metric's bounds and whether the measured value lies within them (NaN: no value)."""
    out: dict = {}
    for metric in INTERVAL_METRICS:
        lo, hi, value = simulated[f"{metric}_lo"], simulated[f"{metric}_hi"], measured[metric]
        out[f"{metric}_lo"], out[f"{metric}_hi"] = lo, hi
        out[f"{metric}_inside"] = math.nan if math.isnan(value) else float(lo <= value <= hi)
    return out


def cell_host_scales(path: Path, pool: str | None = None,
                     column: str = "host_scale") -> dict[tuple[str, str, str], float]:
    """(fleet, workload, load) -> column of a fleet_hosts.py hosts.csv's rows of pool (default: the
    fleet's row; a pool of several replicas: their median)."""
    from experiments.disagg.fleet_hosts import FLEET_POOL

    hosts = pd.read_csv(path, dtype={"fleet": str, "workload": str, "load": str})
    if column not in hosts.columns:
        raise SystemExit(f"error: {path} has no {column} column (written by an older fleet_hosts.py: run it again)")
    rows = hosts[hosts["pool"] == (pool or FLEET_POOL)]
    return {key: float(group[column].median()) for key, group in rows.groupby(["fleet", "workload", "load"])}


def at_host(setup: Setup, scale: float) -> tuple[Setup, float]:
    """setup pricing at the host speed scale (backend.host_scale, in place of the overrides' own);
    setup itself where scale is not a measured one (NaN)."""
    if not scale > 0:
        return setup, math.nan
    own = tuple(o for o in setup.overrides if not o.lstrip("+").startswith("backend.host_scale="))
    return dataclasses.replace(setup, overrides=(*own, f"backend.host_scale={scale:.4f}")), scale


def keep_cell(run: Path, keep: Path, cell: dict, sim, block_size: int) -> None:
    """The cell's measured steps from the call (run/steps_*.csv.gz) beside the re-simulated ones."""
    name = kept_name(cell)
    measured = read_kept(run / name)
    measured = measured[measured["side"] == "measured"].drop(columns=["fleet", "workload", "load"])
    keep.mkdir(parents=True, exist_ok=True)
    table = pd.concat([measured, side_steps("profiled", sim, block_size)], ignore_index=True)
    table.to_csv(keep / name, index=False, float_format="%.6f", compression={"method": "gzip", "compresslevel": 9})


if __name__ == "__main__":
    main()
