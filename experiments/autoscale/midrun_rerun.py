"""The simulated side of a committed mid-run check, again, against its measured side (CPU only).

A run's folder holds the engine's side as compared: engine/timeline.csv and engine/lifetimes.csv
(h200_run2/ on), or midrun_compare.csv and engine_lifetimes.csv (h200_run1/); midrun_summary.csv
the start-up the simulator was given. This serves the simulated fleet again (midrun_dp's default
workload and settings, the run's GPU profile) with each pricing of the new replica's start-up and
scores it as midrun_dp does:

  as_run            the start-up the run's simulator used (its summary's startup_s_sim)
  as_run+setup      that plus the engine's set-up before its first timed phase, which run 1's
                    calibration left out (setup_s of the committed calibration, 0.72 s in each start)
  calibration       the committed calibration of --hardware and --model (from the page cache)
  measured          the engine's own start-up in the run: the serving side scored alone, the
                    start-up's prediction taken out
  FILE              each --calibration file (one with "under_load", from midrun_dp's loaded probe)

--step-scales F ... serves each pricing again with every step priced F times as much (a copy of
the profile: experiments.fidelity.price_sensitivity.every_price_scaled), to show how far each
window's TTFT P90 moves with the step price; --kind-scales KIND=F ... with one kind of step
(prefill or decode) priced F times (price_sensitivity.kind_scaled): which kind's price moves
them. Both are diagnoses, never a model. --profile prices the steps with another profile than
the GPU's shipped one (another grid of the same GPU); --set is a harness override of the
simulated side (backend.decode_programs=false: how runs 1 and 2 were priced). Writes
midrun_rerun.csv (per pricing and variant: midrun_compare's summary) and midrun_rerun_windows.csv
(per window: the engine's TTFT P90 and each variant's, with its error).

  python -m experiments.autoscale.midrun_rerun --run experiments/autoscale/h200_run1 --out /tmp/rerun
  python -m experiments.autoscale.midrun_rerun --run experiments/autoscale/h200_run2 --pricings as_run measured \\
      --step-scales 0.98 0.99 1.01 1.02 --out /tmp/rerun2
  python -m experiments.autoscale.midrun_rerun --run experiments/autoscale/h200_run3 --pricings as_run \\
      --kind-scales decode=0.97 prefill=0.85 --out /tmp/rerun3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from experiments.autoscale import midrun_compare, midrun_dp

DEFAULTS = {"model": "qwen3-0.6b", "rates": "10,45", "t0": 30.0, "duration": 120.0, "window": 10.0,
            "interval": 5.0, "max_num_seqs": 64, "router": "least_requests", "cpu": False, "set": []}
PRICINGS = ("as_run", "as_run+setup", "calibration", "measured")
TIMELINE = ["start_s", "end_s", "arrivals", "serving", "ttft_p90_s"]


def engine_files(run: Path) -> tuple[Path, Path]:
    """The engine's timeline and lifetimes tables of a run folder, in either layout."""
    if (run / "engine" / "timeline.csv").is_file():
        return run / "engine" / "timeline.csv", run / "engine" / "lifetimes.csv"
    return run / "midrun_compare.csv", run / "engine_lifetimes.csv"


def engine_side(run: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    timeline_path, lifetimes_path = engine_files(run)
    timeline = pd.read_csv(timeline_path).rename(columns={"arrivals_engine": "arrivals", "serving_engine": "serving",
                                                          "ttft_p90_s_engine": "ttft_p90_s"})
    return timeline[TIMELINE], pd.read_csv(lifetimes_path)


def pricings(run: Path, hardware: str, model: str, files: list[Path], weight_bytes: int, eager: bool,
             names: tuple[str, ...] = PRICINGS) -> dict:
    from engine.core.elastic import ColdStart
    from harness.autoscale.calibration import calibration_path, read_calibration

    as_run = float(pd.read_csv(run / "midrun_summary.csv")["startup_s_sim"].iloc[0])
    second = engine_side(run)[1].iloc[1]

    def committed():
        return read_calibration(calibration_path(hardware, model))

    every = {"as_run": lambda: ColdStart(process_s=as_run),
             "as_run+setup": lambda: ColdStart(process_s=as_run + committed().setup_s),
             "calibration": lambda: committed().cold_start(0.0, weight_bytes, eager, cached=True),
             "measured": lambda: ColdStart(process_s=float(second["ready_s"] - second["requested_s"]))}
    out = {name: every[name]() for name in names}
    for path in files:
        out[path.name] = read_calibration(path).cold_start(0.0, weight_bytes, eager, cached=True)
    return out


def _score(side: tuple, cold, engine_timeline: pd.DataFrame, engine_lifetimes: pd.DataFrame):
    from harness.autoscale.run import lifetimes_frame, run_autoscaled

    outcome = run_autoscaled(*side, progress=False, cold_start=cold)
    windows = midrun_compare.compare_windows(engine_timeline, outcome.timeline)
    ready = midrun_compare.ready_times(engine_lifetimes, lifetimes_frame(outcome.elastic))
    return midrun_compare.summarize(windows, ready), windows


def _side(hardware: str, scaled: str, scale: float, folder: Path, profile: Path | None = None,
          settings: tuple[str, ...] = ()) -> tuple:
    """The simulated fleet (with the harness overrides settings), the steps of the scaled kind
    ("all", or a kind of price_sensitivity.KIND_REGIMES) priced scale times what the profile
    (default: the run's GPU's shipped one) prices them."""
    from experiments.fidelity.price_sensitivity import every_price_scaled, kind_scaled
    from harness.profiles import shipped_profile

    args = SimpleNamespace(**{**DEFAULTS, "set": list(settings)})
    overrides = midrun_dp.fleet_overrides(args, hardware) + ["backend=sim", "backend.cost_model=profiled"]
    if scale != 1.0 or profile is not None:
        rc = midrun_dp.compose(overrides)[0]
        path = profile if profile is not None else shipped_profile(rc.hardware.name, rc.model.name)
        if scale != 1.0:
            path = every_price_scaled(path, scale, folder) if scaled == "all" else \
                kind_scaled(path, scaled, scale, folder)
        overrides.append(f"backend.profile_path={path}")
    return midrun_dp.compose(overrides)


def rerun(run: Path, out: Path, hardware: str, files: list[Path], names: tuple[str, ...] = PRICINGS,
          step_scales: tuple[float, ...] = (1.0,), kind_scales: tuple[tuple[str, float], ...] = (),
          profile: Path | None = None, settings: tuple[str, ...] = ()) -> pd.DataFrame:
    """kind_scales: (kind, factor) variants served after the step_scales ones (kind "all");
    settings: harness overrides of the simulated side (e.g. the model a run was priced with)."""
    engine_timeline, engine_lifetimes = engine_side(run)
    rows, per_window = [], []
    variants = [("all", scale) for scale in step_scales] + list(kind_scales)
    with tempfile.TemporaryDirectory() as folder:
        for scaled, scale in variants:
            side = _side(hardware, scaled, scale, Path(folder), profile, settings)
            rc = side[0]
            for name, cold in pricings(run, hardware, rc.model.name, files, rc.model.weight_bytes_per_rank(1),
                                       rc.sim.execution.enforce_eager, names).items():
                summary, windows = _score(side, cold, engine_timeline, engine_lifetimes)
                rows.append({"pricing": name, "scaled": scaled, "step_scale": scale,
                             "startup_s_priced": cold.total_s, **summary})
                per_window.append(windows.assign(pricing=name, scaled=scaled, step_scale=scale))
                print(f"[rerun] {name}, {scaled} steps x{scale:g}: start-up {cold.total_s:.2f} s, ready "
                      f"{summary['ready_s_sim']:.2f} s (measured {summary['ready_s_engine']:.2f} s, "
                      f"{100 * summary['ready_error_of_startup']:+.1f}% of its start-up); TTFT P90 within 15% in "
                      f"{summary['windows_within_15pct']} of {summary['windows_scored']} windows", flush=True)
    table = pd.DataFrame(rows)
    windows = pd.concat(per_window, ignore_index=True)[
        ["pricing", "scaled", "step_scale", "start_s", "end_s", "arrivals_engine", "ttft_p90_s_engine",
         "ttft_p90_s_sim", "rel_error", "scored", "within_target"]]
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "midrun_rerun.csv", index=False)
    windows.to_csv(out / "midrun_rerun_windows.csv", index=False)
    return table


def kind_scales(texts: list[str]) -> tuple[tuple[str, float], ...]:
    """--kind-scales KIND=F ... as (kind, factor) pairs; one line naming the option otherwise."""
    from experiments.fidelity.price_sensitivity import KIND_REGIMES

    out = []
    for text in texts:
        kind, _, value = text.partition("=")
        try:
            factor = float(value)
        except ValueError:
            factor = float("nan")
        if kind not in KIND_REGIMES or not factor > 0:
            raise SystemExit(f"error: --kind-scales expects KIND=F with KIND one of {', '.join(KIND_REGIMES)} and "
                             f"F > 0, got {text!r}")
        out.append((kind, factor))
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--run", type=Path, required=True, help="a committed run folder (engine/timeline.csv and "
                   "engine/lifetimes.csv, or midrun_compare.csv and engine_lifetimes.csv; midrun_summary.csv)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hardware", default="h200", help="the run's conf/hardware (its GPU profile prices the steps)")
    p.add_argument("--calibration", type=Path, action="append", default=[], help="another calibration file")
    p.add_argument("--pricings", nargs="+", default=list(PRICINGS), help=f"of {', '.join(PRICINGS)} (default: all)")
    p.add_argument("--step-scales", nargs="+", type=float, default=[1.0], help="every step priced F times (1: as "
                   "profiled); each pricing is served at each")
    p.add_argument("--kind-scales", nargs="+", default=[], metavar="KIND=F", help="one kind of step (prefill or "
                   "decode) priced F times; each served as its own variant, at each pricing")
    p.add_argument("--profile", type=Path, default=None, help="price the steps with this profile instead of the "
                   "GPU's shipped one")
    p.add_argument("--set", action="append", default=[], help="a harness override of the simulated side, e.g. "
                   "backend.decode_programs=false (how a run before that rule was priced)")
    args = p.parse_args(argv)
    for path in (*engine_files(args.run), args.run / "midrun_summary.csv"):
        if not path.is_file():
            raise SystemExit(f"error: --run {args.run} lacks {path.relative_to(args.run)}")
    if unknown := [name for name in args.pricings if name not in PRICINGS]:
        raise SystemExit(f"error: --pricings: unknown {unknown[0]!r}; known: {', '.join(PRICINGS)}")
    if bad := [f for f in args.step_scales if not f > 0]:
        raise SystemExit(f"error: --step-scales must be numbers > 0, got {bad[0]:g}")
    if args.profile is not None and not args.profile.is_file():
        raise SystemExit(f"error: --profile {args.profile} is not a file")
    rerun(args.run, args.out, args.hardware, args.calibration, tuple(args.pricings), tuple(args.step_scales),
          kind_scales(args.kind_scales), args.profile, tuple(args.set))
    return 0


if __name__ == "__main__":
    sys.exit(main())
