"""The simulated side of a committed mid-run check, again, against its measured side (CPU only).

A run's folder (h200_run1/) holds the engine's side as compared: midrun_compare.csv (the engine's
windows) and engine_lifetimes.csv; midrun_summary.csv the start-up the simulator was given. This
serves the simulated fleet again (midrun_dp's default workload and settings, the run's GPU profile)
with each pricing of the new replica's start-up and scores it as midrun_dp does:

  as_run            the start-up the run's simulator used (its summary's startup_s_sim)
  as_run+setup      that plus the engine's set-up before its first timed phase, which the run's
                    calibration left out (setup_s of the committed calibration, 0.72 s in each start)
  calibration       the committed calibration of --hardware and --model (from the page cache)
  FILE              each --calibration file (one with "under_load", from midrun_dp's loaded probe)

  python -m experiments.autoscale.midrun_rerun --run experiments/autoscale/h200_run1 --out /tmp/rerun
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from experiments.autoscale import midrun_compare, midrun_dp

DEFAULTS = {"model": "qwen3-0.6b", "rates": "10,45", "t0": 30.0, "duration": 120.0, "window": 10.0,
            "interval": 5.0, "max_num_seqs": 64, "router": "least_requests", "cpu": False, "set": []}


def engine_side(run: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    windows = pd.read_csv(run / "midrun_compare.csv")
    timeline = windows.rename(columns={"arrivals_engine": "arrivals", "serving_engine": "serving",
                                       "ttft_p90_s_engine": "ttft_p90_s"})
    lifetimes = pd.read_csv(run / "engine_lifetimes.csv")
    return timeline[["start_s", "end_s", "arrivals", "serving", "ttft_p90_s"]], lifetimes


def pricings(run: Path, hardware: str, model: str, files: list[Path], weight_bytes: int, eager: bool) -> dict:
    from engine.core.elastic import ColdStart
    from harness.autoscale.calibration import calibration_path, read_calibration

    as_run = float(pd.read_csv(run / "midrun_summary.csv")["startup_s_sim"].iloc[0])
    committed = read_calibration(calibration_path(hardware, model))
    out = {"as_run": ColdStart(process_s=as_run), "as_run+setup": ColdStart(process_s=as_run + committed.setup_s),
           "calibration": committed.cold_start(0.0, weight_bytes, eager, cached=True)}
    for path in files:
        out[path.name] = read_calibration(path).cold_start(0.0, weight_bytes, eager, cached=True)
    return out


def rerun(run: Path, out: Path, hardware: str, files: list[Path]) -> pd.DataFrame:
    from harness.autoscale.run import lifetimes_frame, run_autoscaled

    args = SimpleNamespace(**DEFAULTS)
    side = midrun_dp.compose(midrun_dp.fleet_overrides(args, hardware) + ["backend=sim", "backend.cost_model=profiled"])
    rc, fleet, router, autoscale, slo = side
    engine_timeline, engine_lifetimes = engine_side(run)
    rows = []
    for name, cold in pricings(run, hardware, args.model, files, rc.model.weight_bytes_per_rank(1),
                               rc.sim.execution.enforce_eager).items():
        outcome = run_autoscaled(rc, fleet, router, autoscale, slo, progress=False, cold_start=cold)
        windows = midrun_compare.compare_windows(engine_timeline, outcome.timeline)
        ready = midrun_compare.ready_times(engine_lifetimes, lifetimes_frame(outcome.elastic))
        summary = midrun_compare.summarize(windows, ready)
        rows.append({"pricing": name, "startup_s_priced": cold.total_s, **summary})
        print(f"[rerun] {name}: start-up {cold.total_s:.2f} s, ready {summary['ready_s_sim']:.2f} s (measured "
              f"{summary['ready_s_engine']:.2f} s, {100 * summary['ready_error_of_startup']:+.1f}% of its start-up); "
              f"TTFT P90 within 15% in {summary['windows_within_15pct']} of {summary['windows_scored']} windows",
              flush=True)
    table = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "midrun_rerun.csv", index=False)
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a committed run folder (midrun_compare.csv, "
                   "engine_lifetimes.csv, midrun_summary.csv)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hardware", default="h200", help="the run's conf/hardware (its GPU profile prices the steps)")
    p.add_argument("--calibration", type=Path, action="append", default=[], help="another calibration file")
    args = p.parse_args(argv)
    for name in ("midrun_compare.csv", "engine_lifetimes.csv", "midrun_summary.csv"):
        if not (args.run / name).is_file():
            raise SystemExit(f"error: --run {args.run} lacks {name}")
    rerun(args.run, args.out, args.hardware, args.calibration)
    return 0


if __name__ == "__main__":
    sys.exit(main())
